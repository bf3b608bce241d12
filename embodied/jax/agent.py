"""Turns a model written as pure functions into an `embodied.Agent`.

A subclass implements `make_model()`, returning a `Model`. The base compiles
the model's functions, keeps the training state on the train devices and a
copy of the policy's parameters on the policy devices, and handles seeds,
carries, checkpoints and the host/device boundary:

    agent = MyAgent(obs_space, act_space, config)   # config.jax, .seed, .logdir
    carry = agent.init_policy(batch_size)
    carry, act, out = agent.policy(carry, obs, mode='train')
    carry, outs, metrics = agent.train(agent.init_train(B), batch)

One learner thread (train, report, save, load) and one actor thread (policy)
may share an agent: the learner publishes a fresh copy of the policy's
parameters after each update and the policy reads whichever copy is newest.
"""

import re
import threading

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import embodied

from . import runtime as runtimelib
from . import tree as treelib


class Model:
    """The pure functions a JAX agent is made of.

    `state` is a pytree whose `state['params']` holds the learned parameters;
    everything else in it (optimizer moments, EMA statistics) is training
    state. `key` arguments are `jax.random` keys, fresh for every call.
    """

    #: Regex over top-level parameter names (with a trailing slash, as in
    #: '^(enc|dyn|pol)/'): the parameters `policy()` reads.
    policy_keys = r'.*'

    def init_state(self, key):
        raise NotImplementedError('init_state(key) -> state')

    def init_policy(self, batch_size):
        raise NotImplementedError('init_policy(batch_size) -> carry')

    def init_train(self, batch_size):
        raise NotImplementedError('init_train(batch_size) -> carry')

    def init_report(self, batch_size):
        raise NotImplementedError('init_report(batch_size) -> carry')

    def policy(self, params, carry, obs, key, mode):
        raise NotImplementedError(
            'policy(params, carry, obs, key, mode) -> carry, act, out')

    def train(self, state, carry, data, key):
        raise NotImplementedError(
            'train(state, carry, data, key) -> state, carry, outs, metrics')

    def report(self, state, carry, data, key):
        raise NotImplementedError(
            'report(state, carry, data, key) -> carry, metrics')

    def batch_keys(self, keys):
        """The subset of a replay batch's keys that train/report consume."""
        return keys

    @property
    def ext_space(self):
        """Extra per-step keys the agent wants in replay batches."""
        return {}


SEED_STREAMS = ('init', 'policy', 'train', 'report')


def _islist(x):
    return isinstance(x, list)


class Agent(embodied.Agent):
    """Base of the JAX agents; see the module docstring."""

    def __init__(self, obs_space, act_space, config):
        self.obs_space = obs_space
        self.act_space = act_space
        self.config = config
        self.runtime = runtimelib.setup(config.jax, config.get('logdir'))
        self.model = self.make_model(
            obs_space, act_space, config, self.runtime.compute_dtype)
        # Per-call seeds derive from (seed, stream, call count); checkpoints
        # store them so a restored agent continues the same random streams.
        self._seed_base = int(config.seed)
        self._calls = {name: 0 for name in SEED_STREAMS}
        self._policy_pattern = re.compile(self.model.policy_keys)
        self._state_lock = threading.Lock()
        self._setup_shardings()
        self._compile()
        init = self._jit(self.model.init_state)
        with self._state_lock:
            self._state = jax.device_put(
                init(self._key('init')), self._train_replicated)
            self._publish_policy_params()

    def make_model(self, obs_space, act_space, config, compute_dtype):
        raise NotImplementedError(
            'make_model(obs_space, act_space, config, compute_dtype) -> Model')

    # Carries

    def init_policy(self, batch_size):
        self._check_divisible(batch_size, self.runtime.policy_devices, 'policy')
        carry = self._jit_init_policy(batch_size)
        return jax.device_put(carry, self._policy_batch)

    def init_train(self, batch_size):
        self._check_divisible(batch_size, self.runtime.train_devices, 'train')
        return jax.device_put(self._jit_init_train(batch_size), self._train_batch)

    def init_report(self, batch_size):
        self._check_divisible(batch_size, self.runtime.train_devices, 'train')
        return jax.device_put(
            self._jit_init_report(batch_size), self._train_batch)

    # Acting and learning

    def policy(self, carry, obs, mode='train'):
        if not self.runtime.enable_policy:
            raise RuntimeError(
                'policy() called on an agent built with jax.enable_policy '
                'False (a train-only agent).')
        if mode not in ('train', 'eval', 'explore'):
            raise ValueError(
                f"policy mode must be train, eval or explore, not '{mode}'.")
        split = any(
            _islist(x) for x in jax.tree.leaves(carry, is_leaf=_islist))
        obs = self._prepare_obs(obs)
        params = self._policy_params
        carry, act, out = self._jit_policy(
            params, carry, obs, self._seed('policy'), mode=mode, split=split)
        act, out = jax.device_get((act, out))
        act = {
            k: np.asarray(v, self.act_space[k].dtype) for k, v in act.items()}
        out = {k: np.asarray(v) for k, v in out.items()}
        return carry, act, out

    def train(self, carry, data):
        data = self._prepare_batch(data)
        with self._state_lock:
            state, carry, outs, metrics = self._jit_train(
                self._state, carry, data, self._seed('train'))
            self._state = state
            # Fetching the results waits for the update to finish; only then
            # are the new parameters published. Published earlier, they would
            # make the policy wait for the whole update.
            outs, metrics = treelib.to_numpy((outs, metrics))
            self._publish_policy_params()
        self._check_finite(metrics, 'train')
        return carry, outs, metrics

    def report(self, carry, data):
        data = self._prepare_batch(data)
        with self._state_lock:
            carry, metrics = self._jit_report(
                self._state, carry, data, self._seed('report'))
        metrics = treelib.to_numpy(metrics)
        self._check_finite(metrics, 'report')
        return carry, metrics

    def stream(self, st):
        """The stream of replay batches, unchanged: `train` and `report` move
        each batch to the train devices with only the keys the model
        consumes (reading ahead could block on the replay's rate limiter,
        which only the caller's own progress releases)."""
        return st

    @property
    def ext_space(self):
        return self.model.ext_space

    # Checkpoints

    def save(self):
        with self._state_lock:
            flat = self._named(self._state)
            data = {k: np.asarray(v) for k, v in jax.device_get(flat).items()}
            data.update(self._rng_state())
            return data

    def load(self, data, regex=None):
        """Restores the saved state; with `regex`, only the entries whose
        names match it (`re.search`), e.g. '^(enc|dyn)/'."""
        with self._state_lock:
            current = self._named(self._state)
            current.update(self._rng_state())
            pattern = re.compile(regex) if regex else None
            wanted = [k for k in current if not pattern or pattern.search(k)]
            if pattern and not wanted:
                raise ValueError(
                    f"load regex '{regex}' matches no entry; names look like "
                    f"{', '.join(list(current)[:5])}.")
            missing = [k for k in wanted if k not in data]
            if missing:
                raise KeyError(
                    f'Checkpoint lacks {len(missing)} entries the agent has, '
                    f'e.g. {", ".join(missing[:5])}.')
            values = {}
            for key in wanted:
                if key.startswith('rng/'):
                    continue
                value = np.asarray(data[key])
                if value.shape != current[key].shape:
                    raise ValueError(
                        f"Checkpoint entry '{key}' has shape {value.shape}, "
                        f"the agent expects {current[key].shape}.")
                values[self._unname(key)] = value.astype(current[key].dtype)
            self._set_rng_state({
                k: data[k] for k in wanted if k.startswith('rng/')})
            state = treelib.replace(self._state, values)
            self._state = jax.device_put(state, self._train_replicated)
            self._publish_policy_params()

    # Internals

    def _setup_shardings(self):
        def shardings(devices):
            mesh = Mesh(np.array(devices), ('batch',))
            return (
                NamedSharding(mesh, PartitionSpec()),
                NamedSharding(mesh, PartitionSpec('batch')))
        self._policy_replicated, self._policy_batch = shardings(
            self.runtime.policy_devices)
        self._train_replicated, self._train_batch = shardings(
            self.runtime.train_devices)

    def _jit(self, fn, **kwargs):
        return jax.jit(fn, **kwargs) if self.runtime.jit else fn

    def _compile(self):
        model = self.model

        def policy(params, carry, obs, seed, mode, split):
            if split:
                carry = jax.tree.map(jnp.stack, carry, is_leaf=_islist)
            key = jax.random.PRNGKey(seed)
            carry, act, out = model.policy(params, carry, obs, key, mode)
            if split:
                size = len(jax.tree.leaves(obs)[0])
                carry = jax.tree.map(
                    lambda x: [x[i] for i in range(size)], carry)
            return carry, act, out

        def train(state, carry, data, seed):
            return model.train(state, carry, data, jax.random.PRNGKey(seed))

        def report(state, carry, data, seed):
            return model.report(state, carry, data, jax.random.PRNGKey(seed))

        if self.runtime.jit:
            self._jit_policy = jax.jit(policy, static_argnames=('mode', 'split'))
            # The state is donated so the update happens in place; the
            # policy never reads it (it has its own copy), so no race.
            self._jit_train = jax.jit(train, donate_argnums=(0, 1))
            self._jit_report = jax.jit(report)
            static = dict(static_argnums=0)
            self._jit_init_policy = jax.jit(model.init_policy, **static)
            self._jit_init_train = jax.jit(model.init_train, **static)
            self._jit_init_report = jax.jit(model.init_report, **static)
        else:
            self._jit_policy = policy
            self._jit_train, self._jit_report = train, report
            self._jit_init_policy = model.init_policy
            self._jit_init_train = model.init_train
            self._jit_init_report = model.init_report

    def _publish_policy_params(self):
        """Copies the policy's parameters to the policy devices (a real copy:
        the train state is donated to the next update)."""
        if not self.runtime.enable_policy:
            return
        params = {
            k: v for k, v in self._state['params'].items()
            if self._policy_pattern.search(k + '/')}
        self._policy_params = jax.device_put(
            params, self._policy_replicated, may_alias=False)

    def _named(self, state):
        flat = treelib.flatten(state)
        return {self._rename(k): v for k, v in flat.items()}

    @staticmethod
    def _rename(name):
        return name[len('params/'):] if name.startswith('params/') else name

    def _unname(self, name):
        return name if name.split('/')[0] in self._state and (
            name.split('/')[0] != 'params') else f'params/{name}'

    def _prepare_obs(self, obs):
        prepared = {}
        for key, space in self.obs_space.items():
            if key not in obs:
                raise KeyError(
                    f"policy: observation '{key}' missing; got keys "
                    f"{sorted(obs)}.")
            prepared[key] = np.asarray(obs[key], space.dtype)
        return jax.device_put(prepared, self._policy_batch)

    def _prepare_batch(self, data):
        keys = self.model.batch_keys([
            k for k, v in data.items()
            if not k.startswith('log/') and _is_numeric(v)])
        return jax.device_put({k: data[k] for k in keys}, self._train_batch)

    def _key(self, name):
        return jax.random.PRNGKey(self._seed(name))

    def _seed(self, name):
        count = self._calls[name]
        self._calls[name] = count + 1
        index = SEED_STREAMS.index(name)
        sequence = np.random.SeedSequence([self._seed_base, index, count])
        return np.uint32(sequence.generate_state(1)[0])

    def _rng_state(self):
        state = {f'rng/{k}': np.int64(v) for k, v in self._calls.items()}
        state['rng/seed'] = np.int64(self._seed_base)
        return state

    def _set_rng_state(self, values):
        if 'rng/seed' in values:
            self._seed_base = int(values['rng/seed'])
        for name in SEED_STREAMS:
            if f'rng/{name}' in values:
                self._calls[name] = int(values[f'rng/{name}'])

    def _check_divisible(self, batch_size, devices, role):
        if batch_size % len(devices):
            raise ValueError(
                f'Batch size {batch_size} does not divide over the '
                f'{len(devices)} {role} devices.')

    def _check_finite(self, metrics, where):
        if not self.runtime.debug:
            return
        bad = [
            k for k, v in metrics.items()
            if np.issubdtype(np.asarray(v).dtype, np.floating) and
            not np.isfinite(v).all()]
        if bad:
            raise FloatingPointError(
                f'{where}: non-finite metrics {", ".join(sorted(bad))}.')


def _is_numeric(value):
    dtype = getattr(value, 'dtype', None)
    return dtype is not None and (
        np.issubdtype(dtype, np.number) or dtype == bool)
