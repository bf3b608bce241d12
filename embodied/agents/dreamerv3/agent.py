"""The DreamerV3 agent (Hafner et al., Nature 2025) on the JAX agent base.

The base runs the agent's methods inside `nj.pure`. The networks, losses and
optimizer are the pure functions of `DreamerModel`; their state (parameters,
optimizer moments, slow critic, return normalisers) lives in the ninjax
state under flat names such as 'enc/mlp/0/kernel' or 'opt/...', so
checkpoints name every entry and `policy_keys` selects by name.
"""

import jax
import ninjax as nj

import embodied.jax
from embodied.jax import nets as jaxnets
from embodied.jax import tree as treelib

from .model import DreamerModel

POLICY_MODULES = ('enc', 'dyn', 'pol')


class Agent(embodied.jax.Agent):
    """DreamerV3: `Agent(obs_space, act_space, config)` where `config` holds
    the `agent` block plus `jax`, `seed`, `logdir`, `replay_context` and the
    batch settings (see `embodied.main.make_agent`)."""

    banner = [
        '--- DreamerV3 (embodied) ---',
    ]

    policy_keys = '^(' + '|'.join(POLICY_MODULES) + ')/'

    def __init__(self, obs_space, act_space, config):
        super().__init__(obs_space, act_space, config)
        self.core = DreamerModel(
            obs_space, act_space, config, jaxnets.COMPUTE_DTYPE)
        shapes = jax.eval_shape(self.core.init_state, jax.random.PRNGKey(0))
        self._layout = jax.tree.structure(shapes)
        self._names = [_entry_name(k) for k in treelib.flatten(shapes)]

    @property
    def ext_space(self):
        return self.core.ext_space

    def init_policy(self, batch_size):
        return self.core.init_policy(batch_size)

    def init_train(self, batch_size):
        return self.core.init_train(batch_size)

    def init_report(self, batch_size):
        return self.core.init_report(batch_size)

    def policy(self, carry, obs, mode='train'):
        params = self._read_state()['params']
        params = {k: params[k] for k in POLICY_MODULES}
        return self.core.policy(params, carry, obs, nj.seed(), mode)

    def train(self, carry, data):
        state = self._read_state()
        state, carry, outs, metrics = self.core.train(
            state, carry, data, nj.seed())
        context = nj.context()
        for name, value in zip(self._names, jax.tree.leaves(state)):
            context[name] = value
        return carry, outs, metrics

    def report(self, carry, data):
        return self.core.report(self._read_state(), carry, data, nj.seed())

    def state_tree(self, flat):
        """The model's nested state from the flat entries by name (entries
        not in `flat` become None)."""
        return jax.tree.unflatten(
            self._layout, [flat.get(name) for name in self._names])

    def _read_state(self):
        """The state from the ninjax context; created on the first trace.
        The policy's context holds only the policy's entries; the others
        read as None."""
        context = nj.context()
        if context.create and self._names[0] not in context:
            initial = self.core.init_state(nj.seed())
            for name, value in zip(self._names, jax.tree.leaves(initial)):
                context[name] = value
        return self.state_tree(
            {n: context[n] for n in self._names if n in context})


def _entry_name(path):
    return path[len('params/'):] if path.startswith('params/') else path
