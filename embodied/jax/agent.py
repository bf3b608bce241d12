"""The original's `embodied.jax.Agent`: an agent written as a model of ninjax
modules (a subclass), compiled and run on devices by this base. The
reference is docs/agents.md ("What the base does"); compiling ahead is in
`compiling.py`, what several replicas change in `hosts.py`.

Thread contract. Tracing a ninjax function uses process-wide state (its name
scope), so every trace in the process runs under one lock, `TRACE_LOCK`;
the column "traces" says when a method can still trace (and take it).

    method          may be called from          lock          traces
    --------------  --------------------------  ------------  ---------------
    init_policy     any thread (actor threads,  seed          a new size
                    the driver)
    policy          any number of threads at    seed, params  a size above
                    once (run.actor_threads)                  all compiled
                                                              or a new mode
    init_train,     one learner thread (waits   state, seed   a new size
    init_report     until compiled ahead)
    train, report   one learner thread (waits   state, seed   new shapes
                    until compiled ahead)
    wait_compiled   the learner thread          none          no
    finish_compiling  the role holding the  none          no
                    agent, once its run ended
    (compiling)     the agent's AgentCompile    state (to     train and
                    thread, while built         run inits)    report, ahead
    stream          the learner thread          none          no
    policy_lag      the learner thread          params        no
    policy_params   one publisher thread        params        no
                    (param_sync.Publisher)
    set_policy_params  one subscriber thread    params        no
                    (param_sync.Subscriber)
    updates,        any thread (plain reads)    none          no
    policy_shardings
    save            any thread (the actor's     state, seed   no
                    server thread in parallel)
    load            the learner, before the     state, seed   no
                    actor acts (link barrier)

The seed lock makes every call draw its own random seed; the state lock
keeps `train`, `report`, `save` and `load` from interleaving. `policy` takes
the acting parameters from `handover.PolicyParams` (its own params lock)
and never waits for `train`.
Construction is not thread-safe: build the agent before starting threads.
"""

import collections
import functools
import re
import threading

import elements
import jax
import jax.numpy as jnp
import ninjax as nj
import numpy as np

import embodied
from embodied.core import outofmemory

from . import compiling
from . import distributed
from . import fetch
from . import handover
from . import hosts
from . import mesh as meshlib
from . import runtime as runtimelib
from . import sharding as shardinglib
from .compiling import TRACE_LOCK, traced_under_lock  # noqa: F401

SEED_STREAMS = ('init', 'policy', 'train', 'report')
MODES = ('train', 'eval', 'explore')
_LOWERING_SEED = compiling.LOWERING_SEED


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
        distributed.start(config)  # Joins the replicas first (no-op for one).
        runtime = runtimelib.setup(config.jax, config.get('logdir'))
        obs_space, act_space = _plain_spaces(obs_space), _plain_spaces(act_space)
        from . import nets
        nets.COMPUTE_DTYPE = runtime.compute_dtype
        model = super().__new__(cls)
        with TRACE_LOCK:  # Modules take ninjax's process-wide name scope.
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

    @outofmemory.program('policy')
    def init_policy(self, batch_size):
        self._require_policy('init_policy')
        self._policy_layout.check_batch(batch_size, 'init_policy batch size')
        self._compiler.ensure_policy(batch_size)
        carry = self._jit_init_policy(
            self._params.acting(),
            self._seeds.next(hosts.policy_init_stream()), batch_size)
        return jax.device_put(carry, self._policy_batch)

    @outofmemory.program('train')
    def init_train(self, batch_size):
        self._compiler.wait_for('train')
        return self._init_train_carry(self._jit_init_train, batch_size)

    @outofmemory.program('report')
    def init_report(self, batch_size):
        self._compiler.wait_for('report')
        return self._init_train_carry(self._jit_init_report, batch_size)

    def _init_train_carry(self, jitted, batch_size):
        batch_size = hosts.global_rows(batch_size)
        self._train_layout.check_batch(batch_size, 'batch size')
        self._first_runs.meet(jitted, _LOWERING_SEED, batch_size)
        with self._state_lock:
            carry = jitted(self._state, self._seeds.next('init'), batch_size)
        return jax.device_put(carry, self._train_batch)

    # Acting and learning

    @outofmemory.program('policy')
    def policy(self, carry, obs, mode='train'):
        self._require_policy('policy')
        if mode not in MODES:
            raise ValueError(
                f"policy mode must be one of {', '.join(MODES)}, not '{mode}'.")
        split = any(
            _islist(x) for x in jax.tree.leaves(carry, is_leaf=_islist))
        rows = _rows(carry, obs, self.obs_space)
        size = self._compiler.policy_size(rows, mode)
        obs = self._prepare_obs(obs, rows, size)
        if size != rows:
            carry = _pad(carry, rows, size, split, self._policy_batch)
        carry, act, out = self._jit_policy(
            self._params.acting(self._updates), carry, obs,
            self._seeds.next('policy'), mode=mode, split=split)
        if size != rows:
            carry = _cut(carry, rows, split)
        act, out = _policy_outputs(act, out, rows, size, self.act_space)
        return carry, act, out

    @outofmemory.program('train')
    def train(self, carry, data):
        """One update. Returns at once, before the device has finished it:
        `outs` and `metrics` are `fetch.Fetched` mappings that wait for the
        update when first read, so a caller that reads them after its next
        `train()` call keeps the device busy."""
        self._compiler.wait_for('train')
        data = self._prepare_batch(data, 'train')
        self._first_runs.meet(
            self._jit_train, carry, data, _LOWERING_SEED)
        with self._state_lock:
            state, carry, outs, metrics = self._jit_train(
                self._state, carry, data, self._seeds.next('train'))
            self._state = state
            self._updates += 1
            self._publish_policy_params()
        outs, metrics = fetch.Fetched(outs), fetch.Fetched(metrics)
        self._check_finite(metrics, 'train')
        return carry, outs, metrics

    @outofmemory.program('report')
    def report(self, carry, data):
        self._compiler.wait_for('report')
        data = self._prepare_batch(data, 'report')
        self._first_runs.meet(
            self._jit_report, carry, data, _LOWERING_SEED)
        with self._state_lock:
            carry, metrics = self._jit_report(
                self._state, carry, data, self._seeds.next('report'))
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

    def policy_params(self):
        """(version, {name: array}): the newest published copy of the
        policy's parameters (a copy the next update does not touch) and
        the update count it is of; for `param_sync.Publisher`."""
        self._require_policy('policy_params')
        return self._params.latest()

    def set_policy_params(self, params, version):
        """Acts with `params` ({name: array} on the policy devices, as
        `policy_shardings` places them) from the next policy call on; for a
        policy fed by another process's learner (`param_sync.Subscriber`).
        `version` is the update count they are of."""
        self._require_policy('set_policy_params')
        missing = sorted(set(self._policy_names) - set(params))
        if missing:
            raise KeyError(
                f'set_policy_params: {len(missing)} policy parameters '
                f'missing, e.g. {", ".join(missing[:5])}.')
        self._params.replace(
            {k: params[k] for k in self._policy_names}, int(version))

    @property
    def policy_shardings(self):
        """{name: sharding} of the policy's parameters on its devices."""
        return dict(self._policy_shardings)

    @property
    def updates(self):
        """How many updates `train` made (the parameters' version)."""
        return self._updates

    def policy_lag(self):
        """How many updates old the parameters were that the policy acted
        with, over the policy calls since the last call: {'policy_lag/mean',
        'policy_lag/max'}, or {} without policy calls."""
        if self._params is None:
            return {}
        return self._params.lag()

    # Compiling ahead (see compiling.py)

    def wait_compiled(self, timeout=None, report=False):
        """Whether `train` (with `report`, also `report`) is compiled, so
        the learner may step, waiting up to `timeout` seconds (None: until
        it is). Raises the error of a failed compile. Code that traces the
        model itself (`nj.pure(agent.model.fn)`) outside `TRACE_LOCK` waits
        with `report=True` first: ninjax's name scope is process-wide."""
        return self._compiler.wait(timeout, report)

    def finish_compiling(self):
        """Waits for train and report to finish compiling in the background,
        saying so when they still do. A role that holds the agent calls it
        when its run has ended before them, while every thread of the
        process still runs: a compile that ends during Python's shutdown,
        with daemon threads being torn down, aborts the process."""
        self._compiler.finish()

    # Checkpoints

    def save(self):
        """The parameters by name plus the random streams' positions
        (`rng/...`), as numpy arrays."""
        with self._state_lock:
            data = {
                k: np.asarray(v)
                for k, v in jax.device_get(self._state).items()}
            data.update(self._seeds.state())
        return data

    def load(self, data, regex=None):
        """Restores the saved state; with `regex`, only the entries whose
        names match it (`re.search`), e.g. '^(enc|dyn)/'."""
        with self._state_lock:
            current = {**self._state, **self._seeds.state()}
            wanted = _wanted_entries(current, data, regex)
            values = _checked_values(current, data, wanted)
            self._seeds.restore({
                k: data[k] for k in wanted if k.startswith('rng/')})
            # Placed as the current parameters are, in the compiler's
            # spelling of their layout (it leaves out mesh axes of size
            # 1): the same layout spelled otherwise is another program to
            # XLA, and a resumed run would compile train and report anew.
            state = {**self._state, **jax.device_put(
                values, {k: self._state[k].sharding for k in values})}
            self._state = state
            self._publish_policy_params(replace=True)

    # Construction

    def _build(self, model, obs_space, act_space, config, runtime):
        self.model = model
        self.obs_space = obs_space
        self.act_space = act_space
        self.config = config
        self.runtime = runtime
        self.spaces = _batch_spaces(model, obs_space, act_space)
        self.banner = getattr(model, 'banner', [])
        # Per-call seeds derive from (seed, stream, call count); checkpoints
        # store them so a restored agent continues the same random streams.
        self._seeds = _Seeds(int(config.seed))
        self._policy_pattern = re.compile(model.policy_keys)
        self._state_lock = threading.Lock()
        # Traces per jitted function; after construction, only arguments
        # of shapes not compiled ahead add to them.
        self.traces = collections.Counter()
        self._built = False
        # With several replicas, the collectives' first runs start together.
        self._first_runs = hosts.FirstRuns(
            lambda: self._state, self._state_lock)
        self._compiler = compiling.Compiler(self, bool(
            self.runtime.jit and config.jax.get('precompile', True)))
        self._compiler.announce(config)
        try:
            self._build_state(model)
            self._compiler.ahead(config)
        except BaseException:
            self._compiler.stop()
            raise
        # Replicas start their first collective together: gloo gives up on
        # a peer that arrives more than 30 s later (e.g. still compiling).
        distributed.barrier('agent-built')
        self._built = True

    @outofmemory.program('init')
    def _build_state(self, model):
        """The meshes, the parameters, the jitted functions and the policy's
        first copy of the parameters: all but compiling ahead."""
        self._setup_shardings(model)
        with self._state_lock:
            self._state = self._init_state()
            self._select_policy_keys()
        self._jit_functions(model)
        with self._state_lock:
            self._publish_policy_params()

    def _init_state(self):
        """Creates the parameters by tracing `init_train` and `train` on a
        zero batch; only the created entries are computed."""
        batch = self._train_layout.data_size
        length = int(self.config.get('batch_length', 1)) + int(
            self.config.get('replay_context', 0))
        init_train = nj.pure(self.model.init_train)
        train = nj.pure(self.model.train)

        def init(seed, data):
            state, carry = init_train(
                {}, batch, seed=seed, create=True, modify=True)
            state, _ = train(
                state, carry, data, seed=seed, create=True, modify=True,
                ignore=True)
            # The layout of each entry by the partition rules, from the
            # shapes this trace created; each device computes its shards.
            self._state_shardings = shardinglib.param_shardings(
                state, self._param_rules, self._train_layout.mesh)
            return shardinglib.constrain(state, self._state_shardings)

        init = self._jit(init)
        return init(self._seeds.next('init'), self._zero_batch(batch, length))

    def _select_policy_keys(self):
        self._policy_names = sorted(
            k for k in self._state if self._policy_pattern.search(k))
        # The policy's parameters by the same rules on the policy mesh.
        self._policy_shardings = shardinglib.param_shardings(
            {k: self._state[k] for k in self._policy_names},
            self._param_rules, self._policy_layout.mesh)
        if not self._policy_names and self.runtime.enable_policy:
            raise ValueError(
                f"policy_keys '{self.model.policy_keys}' matches no parameter; "
                f"names look like {', '.join(list(self._state)[:5])}.")

    def _setup_shardings(self, model):
        """The train and policy meshes (`mesh.Layout`) and the model's
        partition rules (`sharding.py`)."""
        self._train_layout = meshlib.Layout(
            self.runtime.train_devices, self.runtime.train_mesh,
            'jax.train_mesh')
        self._policy_layout = meshlib.Layout(
            self.runtime.policy_devices, self.runtime.policy_mesh,
            'jax.policy_mesh')
        self._train_batch = self._train_layout.batch
        self._policy_batch = self._policy_layout.batch
        rules = getattr(model, 'partition_rules', None) or ((), ())
        self._param_rules, self._activation_rules = (
            list(rules[0]), list(rules[1]))
        hosts.check_replicated_params(self._train_layout, self._param_rules)

    def _jit(self, fn, policy=False, **kwargs):
        """`fn` jitted, its traces under `TRACE_LOCK` with the activation
        rules on the train (or, with `policy`, the policy) mesh, and counted
        in `self.traces` by function name."""
        name = fn.__name__
        layout = self._policy_layout if policy else self._train_layout

        def counted(*args, **kw):
            self.traces[name] += 1
            if (self._built and self.runtime.jit
                    and not self._compiler.active):
                print(
                    f'Agent: tracing {name} for arguments of a new shape '
                    'or mode (not compiled ahead).', flush=True)
            with shardinglib.activations(
                    layout.mesh, self._activation_rules):
                return fn(*args, **kw)
        counted = traced_under_lock(functools.wraps(fn)(counted))
        return jax.jit(counted, **kwargs) if self.runtime.jit else counted

    def _jit_functions(self, model):
        pure = {
            name: nj.pure(getattr(model, name)) for name in (
                'init_policy', 'init_train', 'init_report', 'policy',
                'train', 'report')}

        def train(state, carry, data, seed):
            state, (carry, outs, metrics) = pure['train'](
                state, carry, data, seed=seed)
            # The updated state keeps the layout of the parameters, and the
            # carry that of the batch: otherwise a mesh with t > 1 splits
            # the carry's features over t, and the next call, given that
            # carry, compiles train a second time.
            state = shardinglib.constrain(
                state, {k: self._state_shardings[k] for k in state})
            carry = shardinglib.constrain(carry, self._train_batch)
            return state, carry, outs, metrics

        def report(state, carry, data, seed):
            _, (carry, metrics) = pure['report'](state, carry, data, seed=seed)
            return shardinglib.constrain(carry, self._train_batch), metrics

        static = dict(static_argnums=2)
        self._jit_init_policy = self._jit(
            _init_carry(pure, 'init_policy'), policy=True, **static)
        self._jit_init_train = self._jit(
            _init_carry(pure, 'init_train'), **static)
        self._jit_init_report = self._jit(
            _init_carry(pure, 'init_report'), **static)
        self._jit_policy = self._jit(
            _policy_fn(pure['policy']), policy=True,
            static_argnames=('mode', 'split'))
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
            # A fresh copy on the train devices first (the state is donated
            # to the next update, and a transfer between two meshes may keep
            # buffers of its source), then moved device to device.
            params = _copy_arrays({k: self._state[k] for k in self._policy_names})
            params = hosts.host_params(params, self._train_layout)
            return jax.device_put(params, self._policy_shardings)

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

    def _prepare_obs(self, obs, rows, size):
        """The observations on the policy devices, padded from `rows` to
        `size` rows with copies of the first."""
        prepared = {}
        for key, space in self.obs_space.items():
            if key not in obs:
                raise KeyError(
                    f"policy: observation '{key}' missing; got keys "
                    f"{sorted(obs)}.")
            value = np.asarray(obs[key], space.dtype)
            if len(value) != rows:
                raise ValueError(
                    f"policy: observation '{key}' has {len(value)} rows, the "
                    f'carry {rows}.')
            if size != rows:
                value = np.concatenate(
                    [value, np.repeat(value[:1], size - rows, 0)])
            prepared[key] = value
        return meshlib.global_batch(prepared, self._policy_batch)

    def _zero_batch(self, batch, length):
        data = {
            k: np.zeros((hosts.local_rows(batch), length, *v.shape), v.dtype)
            for k, v in self.spaces.items()}
        return meshlib.global_batch(data, self._train_batch)

    def _batch_to_device(self, data):
        return _OnDevice(self._prepare_batch(data, 'stream'))

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
        return meshlib.global_batch(batch, self._train_batch)

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


class _Seeds:
    """The agent's random streams (`SEED_STREAMS`): each call's seed derives
    from the base seed, the stream and how many seeds it gave before, so a
    restored agent continues the same streams. Thread-safe."""

    def __init__(self, base):
        self._base = base
        self._calls = {name: 0 for name in SEED_STREAMS}
        self._lock = threading.Lock()

    def next(self, name):
        with self._lock:
            count = self._calls[name]
            self._calls[name] = count + 1
        entropy = [self._base, SEED_STREAMS.index(name), count]
        entropy = hosts.seed_entropy(name, entropy)
        sequence = np.random.SeedSequence(entropy)
        return sequence.generate_state(2).astype(np.uint32)

    def state(self):
        """The streams' positions as checkpoint entries `rng/...`."""
        with self._lock:
            state = {f'rng/{k}': np.int64(v) for k, v in self._calls.items()}
            state['rng/seed'] = np.int64(self._base)
        return state

    def restore(self, values):
        """Continues the streams from checkpoint entries `rng/...`."""
        with self._lock:
            if 'rng/seed' in values:
                self._base = int(values['rng/seed'])
            for name in SEED_STREAMS:
                if f'rng/{name}' in values:
                    self._calls[name] = int(values[f'rng/{name}'])


def _batch_spaces(model, obs_space, act_space):
    """The spaces of a learner batch: observations, actions and the model's
    `ext_space`, which must not reuse their keys."""
    ext_space = dict(model.ext_space)
    for name, space in (('observation', obs_space), ('action', act_space)):
        clash = sorted(space.keys() & ext_space.keys())
        if clash:
            raise ValueError(
                f'{type(model).__name__}.ext_space reuses {name} keys '
                f'{clash}.')
    return {**obs_space, **act_space, **ext_space}


def _init_carry(pure, name):
    """The model's `name` (an init_* method) as a function of the
    parameters, a seed and the batch size, returning the carry."""
    def fn(params, seed, batch_size):
        _, carry = pure[name](params, batch_size, seed=seed)
        return carry
    fn.__name__ = name
    return fn


def _policy_fn(pure_policy):
    """The model's policy as a function of the parameters; with `split`, it
    takes and returns the carry as per-row lists."""
    def policy(params, carry, obs, seed, mode, split):
        if split:
            carry = jax.tree.map(jnp.stack, carry, is_leaf=_islist)
        _, (carry, act, out) = pure_policy(
            params, carry, obs, mode, seed=seed, modify=False)
        if split:
            size = len(jax.tree.leaves(obs)[0])
            carry = jax.tree.map(
                lambda x: [x[i] for i in range(size)], carry)
        return carry, act, out
    return policy


def _policy_outputs(act, out, rows, size, act_space):
    """The policy's actions and outputs (of `size` rows) as numpy, cut to
    `rows` rows; the output `finite` (a tree of bools) is checked and
    dropped."""
    act, out = jax.device_get((act, out))
    act = {
        k: np.asarray(v[:rows], act_space[k].dtype) for k, v in act.items()}
    out = fetch.to_numpy(out)
    if size != rows:
        out = jax.tree.map(lambda x: x[:rows], out)
    finite = out.pop('finite', None)
    if finite is not None:
        bad = [k for k, v in elements.tree.flatdict(finite).items()
               if not np.asarray(v).all()]
        if bad:
            raise FloatingPointError(
                f'policy: non-finite values in {", ".join(sorted(bad))}.')
    return act, out


def _wanted_entries(current, data, regex):
    """The names of `current` to load from `data`: all, or those matching
    `regex`; every one must be in `data`."""
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
    return wanted


def _checked_values(current, data, wanted):
    """The parameters among `wanted` from `data`, as arrays of the agent's
    dtypes; a shape that differs from the agent's is refused."""
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
    return values


@jax.jit
def _copy_arrays(tree):
    return jax.tree.map(jnp.copy, tree)


def _islist(x):
    return isinstance(x, list)


def _plain_spaces(spaces):
    """The spaces with Python int shapes (an env may build them from numpy
    integers, which modules take as other values than ints)."""
    plain = {}
    for key, space in spaces.items():
        shape = tuple(int(x) for x in space.shape)
        if shape != space.shape or not all(
                type(x) is int for x in space.shape):
            space = elements.Space(space.dtype, shape, space.low, space.high)
        plain[key] = space
    return plain


def _rows(carry, obs, obs_space):
    """The rows of a policy call: of the carry (a list per leaf when
    split), or of the observations when the carry has no leaves."""
    leaves = jax.tree.leaves(carry, is_leaf=_islist)
    if leaves:
        return len(leaves[0])
    for key in obs_space:
        if key in obs:
            return len(obs[key])
    return 0


def _pad(carry, rows, size, split, sharding):
    """A policy carry of `rows` rows padded to `size` rows with copies of
    its first row (per-row lists when `split`, else placed by
    `sharding`)."""
    if split:
        return jax.tree.map(
            lambda xs: xs + xs[:1] * (size - rows), carry, is_leaf=_islist)
    return jax.device_put(jax.tree.map(
        lambda x: jnp.concatenate(
            [x, jnp.repeat(x[:1], size - rows, 0)]), carry), sharding)


def _cut(carry, rows, split):
    """The first `rows` rows of a policy carry; a stacked carry cut with
    `split` becomes per-row lists."""
    if split:
        return jax.tree.map(lambda xs: xs[:rows], carry, is_leaf=_islist)
    return jax.tree.map(lambda x: x[:rows], carry)


class _OnDevice(dict):
    """A batch `stream()` moved to the train devices already."""
