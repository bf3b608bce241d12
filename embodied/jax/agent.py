"""The original's `embodied.jax.Agent`: an agent written as a model of ninjax
modules, compiled and run on devices by this base.

A subclass is the model. Its `__init__(obs_space, act_space, config)` builds
modules; its methods run inside `nj.pure`, so they create and read
parameters through the modules and draw randomness with `nj.seed()`:

    class MyAgent(embodied.jax.Agent):
        policy_keys = '^(enc|pol)/'   # the parameters policy() reads
        ext_space = {}                # extra per-step keys train() wants
        def init_policy(self, batch_size): -> carry
        def init_train(self, batch_size): -> carry
        def init_report(self, batch_size): -> carry
        def policy(self, carry, obs, mode='train'): -> carry, act, out
        def train(self, carry, data): -> carry, outs, metrics
        def report(self, carry, data): -> carry, metrics

`MyAgent(obs_space, act_space, config)` returns the compiled agent (an
instance of this base that holds the model as `.model`), with the batched
`embodied.Agent` interface. `config` holds `jax` (the original's keys, see
`runtime.setup`), `seed`, `logdir` and, for the first trace of `train`,
`batch_size`, `batch_length` and `replay_context`.

The parameters live on the train devices and `train` updates them in place
(donated). The policy reads its own copy on the policy devices: the learner
offers a fresh copy after an update and the actor swaps it in at a policy
call once the device has made it (`handover.PolicyParams`), so one learner
thread (train, report, save, load) and actor threads (policy) may share an
agent and neither waits for the other.

The learner's path has no host round trip per update: `stream()` moves
batches to the train devices ahead of time in a background thread, and
`train()` returns its outputs and metrics as `fetch.Fetched` mappings whose
copy to the host runs in the background; the runners read them one update
later, after dispatching the next update.
"""

import re
import threading

import elements
import jax
import jax.numpy as jnp
import ninjax as nj
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import embodied

from . import fetch
from . import handover
from . import runtime as runtimelib

SEED_STREAMS = ('init', 'policy', 'train', 'report')
MODES = ('train', 'eval', 'explore')


class Agent(embodied.Agent):
    """Base of the JAX agents; see the module docstring."""

    #: Regex (`re.search`) over parameter names such as 'enc/linear0/kernel':
    #: the parameters `policy()` reads.
    policy_keys = '.*'

    #: Batches `stream()` moves to the train devices ahead of the learner.
    prefetch = 2

    _params = None  # handover.PolicyParams, made by the first publication
    _updates = 0  # train() calls so far: the version of the parameters

    def __new__(cls, obs_space, act_space, config):
        if cls is Agent:
            raise TypeError(
                'embodied.jax.Agent is a base class: subclass it and build '
                'the model in your __init__.')
        runtime = runtimelib.setup(config.jax, config.get('logdir'))
        from . import nets
        nets.COMPUTE_DTYPE = runtime.compute_dtype
        model = super().__new__(cls)
        model.__init__(obs_space, act_space, config)
        # An instance of the base, not of `cls`, so Python does not call
        # `cls.__init__` a second time on it.
        agent = super().__new__(Agent)
        agent._build(model, obs_space, act_space, config, runtime)
        return agent

    def __init__(self, obs_space, act_space, config):
        self.obs_space = obs_space
        self.act_space = act_space
        self.config = config

    @property
    def ext_space(self):
        """Extra per-step keys the model wants in replay batches (none unless
        the subclass says so)."""
        # The compiled agent is an instance of this base itself; the model is
        # an instance of the subclass.
        return dict(self.model.ext_space) if type(self) is Agent else {}

    # Carries

    def init_policy(self, batch_size):
        self._require_policy('init_policy')
        self._check_divisible(batch_size, self.runtime.policy_devices, 'policy')
        carry = self._jit_init_policy(
            self._params.acting(), self._seed('init'), batch_size)
        return jax.device_put(carry, self._policy_batch)

    def init_train(self, batch_size):
        return self._init_train_carry(self._jit_init_train, batch_size)

    def init_report(self, batch_size):
        return self._init_train_carry(self._jit_init_report, batch_size)

    def _init_train_carry(self, jitted, batch_size):
        self._check_divisible(batch_size, self.runtime.train_devices, 'train')
        with self._state_lock:
            carry = jitted(self._state, self._seed('init'), batch_size)
        return jax.device_put(carry, self._train_batch)

    # Acting and learning

    def policy(self, carry, obs, mode='train'):
        self._require_policy('policy')
        if mode not in MODES:
            raise ValueError(
                f"policy mode must be one of {', '.join(MODES)}, not '{mode}'.")
        split = any(
            _islist(x) for x in jax.tree.leaves(carry, is_leaf=_islist))
        obs = self._prepare_obs(obs)
        params = self._params.acting(self._updates)
        carry, act, out = self._jit_policy(
            params, carry, obs, self._seed('policy'), mode=mode, split=split)
        act, out = jax.device_get((act, out))
        act = {
            k: np.asarray(v, self.act_space[k].dtype) for k, v in act.items()}
        out = fetch.to_numpy(out)
        finite = out.pop('finite', None)
        if finite is not None:
            bad = [k for k, v in elements.tree.flatdict(finite).items()
                   if not np.asarray(v).all()]
            if bad:
                raise FloatingPointError(
                    f'policy: non-finite values in {", ".join(sorted(bad))}.')
        return carry, act, out

    def train(self, carry, data):
        """One update. Returns at once, before the device has finished it:
        `outs` and `metrics` are `fetch.Fetched` mappings that wait for the
        update when first read, so a caller that reads them after its next
        `train()` call keeps the device busy."""
        data = self._prepare_batch(data, 'train')
        with self._state_lock:
            state, carry, outs, metrics = self._jit_train(
                self._state, carry, data, self._seed('train'))
            self._state = state
            self._updates += 1
            self._publish_policy_params()
        outs, metrics = fetch.Fetched(outs), fetch.Fetched(metrics)
        self._check_finite(metrics, 'train')
        return carry, outs, metrics

    def report(self, carry, data):
        data = self._prepare_batch(data, 'report')
        with self._state_lock:
            carry, metrics = self._jit_report(
                self._state, carry, data, self._seed('report'))
        metrics = fetch.to_numpy(metrics)
        self._check_finite(metrics, 'report')
        return carry, metrics

    def stream(self, st):
        """The batches of `st`, moved to the train devices (only the keys the
        model consumes) up to `prefetch` batches ahead by a background thread.

        Reading ahead cannot deadlock on the replay's rate limiter: the
        thread takes batches in the order the learner would, so the learner
        waits for a batch only where it would have waited for the replay
        anyway, and `train()` never waits for the thread. At the end of `st`
        (or a stop), the batches read ahead are delivered before
        StopIteration. Up to `prefetch` sampled batches go untrained when the
        learner stops first; `close()` the returned stream then."""
        return embodied.streams.Prefetch(
            st, self._batch_to_device, amount=self.prefetch)

    def policy_lag(self):
        """How many updates old the parameters were that the policy acted
        with, over the policy calls since the last call: {'policy_lag/mean',
        'policy_lag/max'}, or {} without policy calls."""
        if self._params is None:
            return {}
        return self._params.lag()

    # Checkpoints

    def save(self):
        """The parameters by name plus the random streams' positions
        (`rng/...`), as numpy arrays."""
        with self._state_lock:
            data = {
                k: np.asarray(v)
                for k, v in jax.device_get(self._state).items()}
        data.update(self._rng_state())
        return data

    def load(self, data, regex=None):
        """Restores the saved state; with `regex`, only the entries whose
        names match it (`re.search`), e.g. '^(enc|dyn)/'."""
        with self._state_lock:
            current = dict(self._state)
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
                values[key] = value.astype(current[key].dtype)
            self._set_rng_state({
                k: data[k] for k in wanted if k.startswith('rng/')})
            state = {**self._state, **jax.device_put(
                values, self._train_replicated)}
            self._state = state
            self._publish_policy_params(replace=True)

    # Construction

    def _build(self, model, obs_space, act_space, config, runtime):
        self.model = model
        self.obs_space = obs_space
        self.act_space = act_space
        self.config = config
        self.runtime = runtime
        ext_space = dict(model.ext_space)
        for name, space in (('observation', obs_space), ('action', act_space)):
            clash = sorted(space.keys() & ext_space.keys())
            if clash:
                raise ValueError(
                    f'{type(model).__name__}.ext_space reuses {name} keys '
                    f'{clash}.')
        self.spaces = {**obs_space, **act_space, **ext_space}
        self.banner = getattr(model, 'banner', [])
        # Per-call seeds derive from (seed, stream, call count); checkpoints
        # store them so a restored agent continues the same random streams.
        self._seed_base = int(config.seed)
        self._calls = {name: 0 for name in SEED_STREAMS}
        self._policy_pattern = re.compile(model.policy_keys)
        self._state_lock = threading.Lock()
        self._setup_shardings()
        self._compile(model)
        with self._state_lock:
            self._state = self._init_state()
            self._select_policy_keys()
            self._publish_policy_params()

    def _init_state(self):
        """Creates the parameters by tracing `init_train` and `train` on a
        zero batch; only the created entries are computed."""
        batch = max(1, len(self.runtime.train_devices))
        length = int(self.config.get('batch_length', 1)) + int(
            self.config.get('replay_context', 0))
        data = {
            k: np.zeros((batch, length, *v.shape), v.dtype)
            for k, v in self.spaces.items()}
        init_train = nj.pure(self.model.init_train)
        train = nj.pure(self.model.train)

        def init(seed, data):
            state, carry = init_train(
                {}, batch, seed=seed, create=True, modify=True)
            state, _ = train(
                state, carry, data, seed=seed, create=True, modify=True,
                ignore=True)
            return state

        init = self._jit(init)
        state = init(self._seed('init'), jax.device_put(data, self._train_batch))
        return jax.device_put(state, self._train_replicated)

    def _select_policy_keys(self):
        self._policy_names = sorted(
            k for k in self._state if self._policy_pattern.search(k))
        if not self._policy_names and self.runtime.enable_policy:
            raise ValueError(
                f"policy_keys '{self.model.policy_keys}' matches no parameter; "
                f"names look like {', '.join(list(self._state)[:5])}.")

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

    def _compile(self, model):
        pure = {
            name: nj.pure(getattr(model, name)) for name in (
                'init_policy', 'init_train', 'init_report', 'policy',
                'train', 'report')}

        def init_carry(name):
            def fn(params, seed, batch_size):
                _, carry = pure[name](params, batch_size, seed=seed)
                return carry
            return fn

        def policy(params, carry, obs, seed, mode, split):
            if split:
                carry = jax.tree.map(jnp.stack, carry, is_leaf=_islist)
            _, (carry, act, out) = pure['policy'](
                params, carry, obs, mode, seed=seed, modify=False)
            if split:
                size = len(jax.tree.leaves(obs)[0])
                carry = jax.tree.map(
                    lambda x: [x[i] for i in range(size)], carry)
            return carry, act, out

        def train(state, carry, data, seed):
            state, (carry, outs, metrics) = pure['train'](
                state, carry, data, seed=seed)
            return state, carry, outs, metrics

        def report(state, carry, data, seed):
            _, (carry, metrics) = pure['report'](state, carry, data, seed=seed)
            return carry, metrics

        static = dict(static_argnums=2)
        self._jit_init_policy = self._jit(init_carry('init_policy'), **static)
        self._jit_init_train = self._jit(init_carry('init_train'), **static)
        self._jit_init_report = self._jit(init_carry('init_report'), **static)
        self._jit_policy = self._jit(policy, static_argnames=('mode', 'split'))
        # The state and carry are donated so the update happens in place;
        # the policy never reads them (it has its own copy), so no race.
        self._jit_train = self._jit(train, donate_argnums=(0, 1))
        self._jit_report = self._jit(report)

    # Internals

    def _require_policy(self, method):
        if not self.runtime.enable_policy:
            raise RuntimeError(
                f'{method}() called on an agent built with jax.enable_policy '
                'False (a train-only agent).')

    def _publish_policy_params(self, replace=False):
        """Offers the actor a copy of the policy's parameters on the policy
        devices (a real copy: the train state is donated to the next update),
        dispatched without waiting. With `replace` (after a load), the copy
        acts from the next policy call on."""
        if not self.runtime.enable_policy:
            return

        def copy():
            params = {k: self._state[k] for k in self._policy_names}
            return jax.device_put(
                params, self._policy_replicated, may_alias=False)

        if self._params is None:
            self._params = handover.PolicyParams(copy(), self._updates)
        elif replace:
            self._params.replace(copy(), self._updates)
        else:
            self._params.offer(copy, self._updates)

    @property
    def _policy_params(self):
        """The newest published policy parameters (for inspection)."""
        return self._params.newest()

    def _batch_to_device(self, data):
        return _OnDevice(self._prepare_batch(data, 'stream'))

    def _prepare_obs(self, obs):
        prepared = {}
        for key, space in self.obs_space.items():
            if key not in obs:
                raise KeyError(
                    f"policy: observation '{key}' missing; got keys "
                    f"{sorted(obs)}.")
            prepared[key] = np.asarray(obs[key], space.dtype)
        return jax.device_put(prepared, self._policy_batch)

    def _prepare_batch(self, data, method):
        """The batch's keys that the model declared (observations, actions,
        ext_space), moved to the train devices. Extra keys (log/..., strings,
        replay bookkeeping) are left out; an ext_space key the replay does not
        provide is left out too. A batch from `stream()` is there already."""
        if isinstance(data, _OnDevice):
            return dict(data)  # A plain dict: jit takes no subclasses.
        needed = [*self.obs_space, *self.act_space]
        missing = [k for k in needed if k not in data]
        if missing:
            raise KeyError(
                f'{method}: batch lacks {", ".join(missing)}; got keys '
                f'{sorted(data)}.')
        batch = {
            k: np.asarray(data[k], self.spaces[k].dtype)
            for k in self.spaces if k in data}
        return jax.device_put(batch, self._train_batch)

    def _seed(self, name):
        count = self._calls[name]
        self._calls[name] = count + 1
        index = SEED_STREAMS.index(name)
        sequence = np.random.SeedSequence([self._seed_base, index, count])
        return sequence.generate_state(2).astype(np.uint32)

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


def _islist(x):
    return isinstance(x, list)


class _OnDevice(dict):
    """A batch `stream()` moved to the train devices already."""


treemap_numpy = fetch.to_numpy
