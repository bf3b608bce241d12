"""The original's `embodied.jax.Agent`: an agent written as a model of ninjax
modules, compiled and run on devices by this base.

A subclass is the model. Its `__init__(obs_space, act_space, config)` builds
modules; its methods run inside `nj.pure`, so they create and read
parameters through the modules and draw randomness with `nj.seed()`:

    class MyAgent(embodied.jax.Agent):
        policy_keys = '^(enc|pol)/'   # the parameters policy() reads
        ext_space = {}                # extra per-step keys train() wants
        partition_rules = ([(regex, PartitionSpec)], [...])  # optional
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

Devices. The learner runs on the train mesh and the policy on the policy
mesh (`jax.train_mesh`, `jax.policy_mesh`: 'd,f,t', see `mesh.py`); batches
are split over the data axes ('d', 'f'), and the state (parameters,
optimizer) is laid out by the model's `partition_rules` (see
`sharding.py`; replicated without rules). `save()` returns whole host
arrays and `load()` lays them out by the current mesh, so checkpoints do
not depend on the layout.

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

Compiling ahead. Building the agent (with `jax.precompile`, the default)
compiles the parameters' init and then `init_policy` and `policy` at the
sizes in `config.policy_batches` ({mode: [batch sizes]}, optional;
`embodied.main` passes the sizes its runner uses), and returns: the actor
can act at once. Unless `config.trains` is False (a runner that never
trains, `eval_only`), a background thread ('AgentCompile') then compiles
`init_train` and `train` (batch_size x batch_length + replay_context), then
`init_report` and `report` (batch_size x report_length + replay_context):
it lowers each under `TRACE_LOCK` and lets XLA compile outside it (the
state lock only while it runs an init). Report compiles after train, not
beside it: the learner's first step needs train alone, and two compiles
at once would share the CPU cores and the GPU's autotuning. A process that
exits meanwhile waits for the compile (XLA cannot stop one; a line says
so). `init_train` and `train` wait until train is compiled,
`init_report` and `report` until report is (`wait_compiled` polls it), so
the learner trains while report still compiles. Code that traces the
model itself outside `TRACE_LOCK` calls `wait_compiled(report=True)`
first. With several replicas all of this happens before the constructor
returns (they meet at barriers while compiling). Every 30 s of compiling the agent prints what it
compiles; `Compiled the agent in ...` ends it.
`init_policy(n)` compiles the policy (mode train) for a size not compiled
in any mode. A policy
batch of n rows runs on the smallest compiled size >= n, padded with copies
of its first row and the results cut back to n rows, so partial batches
never trace anew. `self.traces` counts the traces per function.

Replicas (several hosts, `distributed`). Building the agent first joins
the run's replicas when `config.replicas > 1` (JAX's distributed runtime).
The train mesh then spans every host's devices and the policy mesh this
host's. `init_train(n)`, `init_report(n)`, `train` and `report` take this
host's n rows; the global batch is n times the number of replicas (each
host's rows joined in replica order). `train` and `report` are collectives:
every replica must call them equally often and in the same order (the
first run at new shapes waits for every replica: gloo would give up on one
more than 30 s late); `save`
and `load` are not, as the parameters are replicated (a train mesh on
which the partition rules would split them is refused).

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

import bisect
import collections
import functools
import os
import re
import threading
import time
import weakref

import elements
import jax
import jax.numpy as jnp
import ninjax as nj
import numpy as np

import embodied

from . import distributed
from . import fetch
from . import handover
from . import mesh as meshlib
from . import runtime as runtimelib
from . import sharding as shardinglib

SEED_STREAMS = ('init', 'policy', 'train', 'report')
MODES = ('train', 'eval', 'explore')
# The seed given when compiling ahead: no random stream advances.
_LOWERING_SEED = np.zeros(2, np.uint32)

#: Held by every trace of an agent's function in this process: ninjax keeps
#: its name scope in a process-wide variable, so two traces at once (say the
#: actor's first policy and the learner's first train) corrupt each other.
#: Reentrant, as a trace may start another.
TRACE_LOCK = threading.RLock()


def _compiles_learner(config):
    """Whether building the agent compiles train and report ahead: with a
    batch to compile them for, unless the runner never trains."""
    return bool(config.get('batch_size') and config.get('batch_length')
                and config.get('trains', True))


def traced_under_lock(fn):
    """`fn` run under `TRACE_LOCK`; for the functions given to `jax.jit`,
    whose Python body only runs when JAX traces them."""
    @functools.wraps(fn)
    def locked(*args, **kwargs):
        with TRACE_LOCK:
            return fn(*args, **kwargs)
    return locked


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

    def init_policy(self, batch_size):
        self._require_policy('init_policy')
        self._policy_layout.check_batch(batch_size, 'init_policy batch size')
        compiled = any(batch_size in s for s in self._policy_sizes.values())
        if self._precompile and not compiled:
            self._compile_policy([batch_size], ['train'])
        return self._init_policy_carry(batch_size)

    def _init_policy_carry(self, batch_size):
        carry = self._jit_init_policy(
            self._params.acting(), self._seed(self._policy_init_stream()),
            batch_size)
        return jax.device_put(carry, self._policy_batch)

    def init_train(self, batch_size):
        self._await_compiled('train')
        return self._init_train_carry(self._jit_init_train, batch_size)

    def init_report(self, batch_size):
        self._await_compiled('report')
        return self._init_train_carry(self._jit_init_report, batch_size)

    def _init_train_carry(self, jitted, batch_size):
        batch_size = self._global_batch(batch_size)
        self._train_layout.check_batch(batch_size, 'batch size')
        self._meet_before_first_run(jitted, _LOWERING_SEED, batch_size)
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
        rows = self._rows(carry, obs)
        size = self._policy_size(rows, mode)
        obs = self._prepare_obs(obs, rows, size)
        carry = self._pad_carry(carry, rows, size, split)
        carry, act, out = self._jit_policy(
            self._params.acting(self._updates), carry, obs,
            self._seed('policy'), mode=mode, split=split)
        if size != rows:
            carry = _cut(carry, rows, split)
        act, out = jax.device_get((act, out))
        act = {
            k: np.asarray(v[:rows], self.act_space[k].dtype)
            for k, v in act.items()}
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
        return carry, act, out

    def train(self, carry, data):
        """One update. Returns at once, before the device has finished it:
        `outs` and `metrics` are `fetch.Fetched` mappings that wait for the
        update when first read, so a caller that reads them after its next
        `train()` call keeps the device busy."""
        self._await_compiled('train')
        data = self._prepare_batch(data, 'train')
        self._meet_before_first_run(
            self._jit_train, carry, data, _LOWERING_SEED)
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
        self._await_compiled('report')
        data = self._prepare_batch(data, 'report')
        self._meet_before_first_run(
            self._jit_report, carry, data, _LOWERING_SEED)
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
        self._seed_lock = threading.Lock()
        self._policy_pattern = re.compile(model.policy_keys)
        self._state_lock = threading.Lock()
        # Sorted batch sizes the policy is compiled for, per mode.
        self._policy_sizes = {mode: [] for mode in MODES}
        # Traces per jitted function; after construction, only arguments
        # of shapes not compiled ahead add to them.
        self.traces = collections.Counter()
        self._built = False
        self._collective_shapes = set()  # See _meet_before_first_run.
        self._compiling = False  # Set while compiling ahead, under TRACE_LOCK.
        # Set once train (report) is compiled; the learner's calls wait.
        self._compiled = {'train': threading.Event(),
                          'report': threading.Event()}
        self._compile_error = None
        self._precompile = bool(
            self.runtime.jit and config.jax.get('precompile', True))
        self._progress = _CompileProgress()
        if self._precompile:
            print(f'Agent: compiling {self._compile_plan(config)}; '
                  f'{_cache_text(self.runtime.cache_dir)}.', flush=True)
            self._progress.start('the parameters')
        try:
            self._setup_shardings(model)
            with self._state_lock:
                self._state = self._init_state()
                self._select_policy_keys()
            self._jit_functions(model)
            with self._state_lock:
                self._publish_policy_params()
            if self._precompile:
                self._compile_ahead()
            else:
                for event in self._compiled.values():
                    event.set()
        except BaseException:
            self._progress.stop()
            raise
        # Replicas start their first collective together: gloo gives up on
        # a peer that arrives more than 30 s later (e.g. still compiling).
        distributed.barrier('agent-built')
        self._built = True

    def _init_state(self):
        """Creates the parameters by tracing `init_train` and `train` on a
        zero batch; only the created entries are computed."""
        batch = self._train_layout.data_size
        length = int(self.config.get('batch_length', 1)) + int(
            self.config.get('replay_context', 0))
        data = {
            k: np.zeros((self._local_rows(batch), length, *v.shape), v.dtype)
            for k, v in self.spaces.items()}
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
        return init(
            self._seed('init'), meshlib.global_batch(data, self._train_batch))

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
        self._check_replicated_params()

    def _check_replicated_params(self):
        """With several replicas, refuses a train mesh on which the model's
        partition rules would split the parameters (f or t above 1): each
        replica's policy copies them to its own devices, and replica 0
        alone saves them, so every host must hold all of them."""
        layout = self._train_layout
        if jax.process_count() == 1 or not self._param_rules:
            return
        if layout.shape['f'] == 1 and layout.shape['t'] == 1:
            return
        raise meshlib.LayoutError(
            f"{layout.key} is '{layout.text}' (f={layout.shape['f']}, "
            f"t={layout.shape['t']}), on which the model's partition rules "
            f"split the parameters; with {jax.process_count()} replicas "
            f"every host must hold all parameters (its policy acts on its "
            f"own copy and replica 0 alone saves them). Split the batch "
            f"only: f and t of 1, e.g. {layout.key} '{meshlib.DEFAULT}'.")

    def _jit(self, fn, policy=False, **kwargs):
        """`fn` jitted, its traces under `TRACE_LOCK` with the activation
        rules on the train (or, with `policy`, the policy) mesh, and counted
        in `self.traces` by function name."""
        name = fn.__name__
        layout = self._policy_layout if policy else self._train_layout

        def counted(*args, **kw):
            self.traces[name] += 1
            if self._built and self.runtime.jit and not self._compiling:
                print(
                    f'Agent: tracing {name} for arguments of a new shape '
                    'or mode (not compiled ahead).', flush=True)
            with shardinglib.activations(
                    layout.mesh, self._activation_rules):
                return fn(*args, **kw)
        counted = traced_under_lock(functools.wraps(fn)(counted))
        return jax.jit(counted, **kwargs) if self.runtime.jit else counted

    def _compile_ahead(self):
        """Compiles the policy at `config.policy_batches` now, then what the
        learner calls at the configured shapes (see the module docstring):
        in a background thread, or here with several replicas, which meet
        at barriers while they compile."""
        config = self.config
        policy = {
            mode: sorted({int(x) for x in sizes}) for mode, sizes in
            dict(config.get('policy_batches', {})).items() if sizes}
        if not self.runtime.enable_policy:
            policy = {}
        learner = _compiles_learner(config)
        text = ', '.join(f'{m} {s}' for m, s in policy.items())
        self._progress.phase('the policy' if policy else 'train and report')
        for mode, sizes in policy.items():
            self._compile_policy(sizes, [mode], announce=False)
        policy_seconds = self._progress.elapsed()
        if policy and learner:
            print(
                f'Agent: the policy is compiled (batch sizes {text}) '
                f'{policy_seconds:.1f} s after the start; train and report '
                f'compile while it acts.', flush=True)

        def compile_learner():
            try:
                if learner:
                    self._compile_learner(config)
            finally:
                self._progress.stop()
            total = self._progress.elapsed()
            parts = []
            if learner:
                parts.append(
                    f'train and report {total - policy_seconds:.1f} s')
            if text:
                parts.append(f'policy at batch sizes {text}')
            print(f'Compiled the agent in {total:.1f} s'
                  + (f' ({"; ".join(parts)})' if parts else '') + '.',
                  flush=True)

        if distributed.started() or not learner:
            try:
                compile_learner()
            finally:
                for event in self._compiled.values():
                    event.set()
            return
        # Never a daemon, even when the agent is built on a daemon thread
        # (whose daemon flag a new thread inherits): XLA cannot stop a
        # compile, and a daemon thread that ends its compile while Python
        # shuts down aborts the process ('exception not rethrown').
        thread = threading.Thread(
            target=self._background(compile_learner), name='AgentCompile',
            daemon=False)
        thread.start()
        _COMPILING.add(thread)
        self._compile_thread = thread

    def finish_compiling(self):
        """Waits for train and report to finish compiling in the background,
        saying so when they still do. A role that holds the agent calls it
        when its run has ended before them, while every thread of the
        process still runs: a compile that ends during Python's shutdown,
        with daemon threads being torn down, aborts the process."""
        thread = getattr(self, '_compile_thread', None)
        if thread is None or not thread.is_alive():
            return
        print('Agent: waiting for train and report to finish compiling '
              'before this process exits (XLA cannot stop a compile).',
              flush=True)
        thread.join()

    def _background(self, fn):
        """`fn` for the compile thread: an error it raises is kept, and
        raised again by the learner's next call (`_await_compiled`)."""
        def run():
            try:
                fn()
            except BaseException as e:
                self._compile_error = e
                print(f'Agent: compiling train and report failed: '
                      f'{type(e).__name__}: {e}', flush=True)
            finally:
                for event in self._compiled.values():
                    event.set()
        return run

    def _compile_plan(self, config):
        """What building the agent compiles, in order, in words."""
        parts = ['the parameters']
        policy = {
            mode: sorted({int(x) for x in sizes}) for mode, sizes in
            dict(config.get('policy_batches', {})).items() if sizes}
        if policy and self.runtime.enable_policy:
            parts.append('the policy at batch sizes ' + ', '.join(
                f'{m} {s}' for m, s in policy.items()))
        if _compiles_learner(config):
            where = ('' if distributed.started() else
                     ' in the background while the policy acts')
            parts.append(f'then train and report{where}')
        return ', '.join(parts)

    def wait_compiled(self, timeout=None, report=False):
        """Whether `train` (with `report`, also `report`) is compiled, so
        the learner may step, waiting up to `timeout` seconds (None: until
        it is). Raises the error of a failed compile. Code that traces the
        model itself (`nj.pure(agent.model.fn)`) outside `TRACE_LOCK` waits
        with `report=True` first: ninjax's name scope is process-wide."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._await_compiled('train', timeout):
            return False
        if not report:
            return True
        left = None if deadline is None else max(
            0.0, deadline - time.monotonic())
        return self._await_compiled('report', left)

    def _await_compiled(self, name, timeout=None):
        done = self._compiled[name].wait(timeout)
        if done and self._compile_error is not None:
            raise RuntimeError(
                f'Compiling {name} failed: '
                f'{type(self._compile_error).__name__}: '
                f'{self._compile_error}') from self._compile_error
        return done

    def _compile_learner(self, config):
        """Compiles `init_train` and `train`, then `init_report` and
        `report`, marking each pair compiled. Each program is lowered under
        `TRACE_LOCK` and compiled by XLA outside it (XLA releases the GIL),
        so the actor's threads act meanwhile; no state lock is held while
        XLA compiles, so saves, loads and train steps go on too."""
        batch = self._global_batch(int(config.batch_size))
        context = int(config.get('replay_context', 0))
        train_length = int(config.batch_length) + context
        report_length = int(config.get(
            'report_length', config.batch_length)) + context
        self._train_layout.check_batch(batch, 'batch_size')
        seed = _LOWERING_SEED
        for name, init, step, length in (
                ('train', self._jit_init_train, self._jit_train,
                 train_length),
                ('report', self._jit_init_report, self._jit_report,
                 report_length)):
            self._progress.phase(name)
            # Lowering reads only the state's shapes and layout, which stay
            # valid after train donated its arrays: no state lock, so saves
            # and train steps go on while this thread traces.
            self._lower(init, self._state, seed, batch).compile()
            # A collective: replicas run it together, as gloo allows a
            # late one 30 s (see _meet_before_first_run).
            distributed.barrier(f'compiled-ahead-{name}')
            data = self._zero_batch(batch, length)
            with self._state_lock:  # Runs on the arrays of the moment.
                carry = jax.device_put(
                    init(self._state, seed, batch), self._train_batch)
            self._lower(step, self._state, carry, data, seed).compile()
            if name == 'train':  # Report's is set once the line is out.
                self._compiled[name].set()

    def _lower(self, jitted, *args):
        """`jitted` lowered for `args` under `TRACE_LOCK` (a trace, not a
        new shape the learner met)."""
        with TRACE_LOCK:
            self._compiling = True
            try:
                return jitted.lower(*args)
            finally:
                self._compiling = False

    def _compile_policy(self, sizes, modes, announce=True):
        """Compiles `init_policy` and `policy` (for stacked carries and for
        per-row ones) at each batch size for each mode."""
        with TRACE_LOCK:  # Also keeps two threads from compiling one size.
            self._compiling = True
            try:
                self._compile_policy_locked(sizes, modes, announce)
            finally:
                self._compiling = False

    def _compile_policy_locked(self, sizes, modes, announce):
        start = time.monotonic()
        params, seed = self._policy_params, _LOWERING_SEED
        for size in sizes:
            self._policy_layout.check_batch(size, 'policy batch size')
            self._jit_init_policy.lower(params, seed, size).compile()
            carry = jax.device_put(
                self._jit_init_policy(params, seed, size), self._policy_batch)
            obs = self._prepare_obs(
                {k: np.zeros((size, *v.shape), v.dtype)
                 for k, v in self.obs_space.items()}, size, size)
            for mode in modes:
                if size in self._policy_sizes[mode]:
                    continue
                # Per-row carries as the actor holds them: rows of an
                # earlier policy call's output.
                rows, _, _ = self._jit_policy(
                    params, carry, obs, seed, mode=mode, split=True)
                for split, value in ((False, carry), (True, rows)):
                    self._jit_policy.lower(
                        params, value, obs, seed, mode=mode,
                        split=split).compile()
                bisect.insort(self._policy_sizes[mode], size)
        if announce:
            print(
                f'Compiled the policy at batch sizes {sizes} in mode '
                f'{", ".join(modes)} in {time.monotonic() - start:.1f} s.',
                flush=True)

    def _policy_size(self, rows, mode):
        """The compiled batch size a policy call of `rows` rows runs at,
        compiling one (under the trace lock) when none fits."""
        if not self._precompile:
            return rows
        sizes = self._policy_sizes[mode]
        index = bisect.bisect_left(sizes, rows)
        if index < len(sizes):
            return sizes[index]
        devices = self._policy_layout.data_size
        size = -(-rows // devices) * devices
        self._compile_policy([size], [mode])
        return size

    def _rows(self, carry, obs):
        """The rows of a policy call: of the carry (a list per leaf when
        split), or of the observations when the carry has no leaves."""
        leaves = jax.tree.leaves(carry, is_leaf=_islist)
        if leaves:
            return len(leaves[0])
        for key in self.obs_space:
            if key in obs:
                return len(obs[key])
        return 0

    def _pad_carry(self, carry, rows, size, split):
        if size == rows:
            return carry
        if split:
            return jax.tree.map(
                lambda xs: xs + xs[:1] * (size - rows), carry, is_leaf=_islist)
        return jax.device_put(jax.tree.map(
            lambda x: jnp.concatenate(
                [x, jnp.repeat(x[:1], size - rows, 0)]), carry),
            self._policy_batch)

    def _zero_batch(self, batch, length):
        data = {
            k: np.zeros((self._local_rows(batch), length, *v.shape), v.dtype)
            for k, v in self.spaces.items()}
        return meshlib.global_batch(data, self._train_batch)

    def _jit_functions(self, model):
        pure = {
            name: nj.pure(getattr(model, name)) for name in (
                'init_policy', 'init_train', 'init_report', 'policy',
                'train', 'report')}

        def init_carry(name):
            def fn(params, seed, batch_size):
                _, carry = pure[name](params, batch_size, seed=seed)
                return carry
            fn.__name__ = name
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
            init_carry('init_policy'), policy=True, **static)
        self._jit_init_train = self._jit(init_carry('init_train'), **static)
        self._jit_init_report = self._jit(init_carry('init_report'), **static)
        self._jit_policy = self._jit(
            policy, policy=True, static_argnames=('mode', 'split'))
        # The state and carry are donated so the update happens in place;
        # the policy never reads them (it has its own copy), so no race.
        self._jit_train = self._jit(train, donate_argnums=(0, 1))
        self._jit_report = self._jit(report)

    # Replicas (several hosts; see `distributed`)

    def _meet_before_first_run(self, jitted, *args):
        """With several replicas, compiles the collective `jitted` for the
        state and `args` (if not yet) and, the first time it runs at these
        shapes, waits until every replica is about to run it too. Gloo
        builds a program's connections on its first run and gives up on a
        peer that arrives more than 30 s later (still compiling, or still
        waiting for its first batch). Replicas call the collectives in the
        same order, so they meet at these barriers in the same order."""
        if not distributed.started():
            return
        # The state's shapes never change; the carry's and data's can.
        key = (jitted, _signature(args))
        if key in self._collective_shapes:
            return
        with self._state_lock:
            jitted.lower(self._state, *args).compile()
        self._collective_shapes.add(key)
        distributed.barrier(f'first-run-{len(self._collective_shapes)}')

    def _global_batch(self, batch_size):
        """The rows of a learner batch over all replicas: each host feeds
        `batch_size` rows of its own replay."""
        return batch_size * jax.process_count()

    def _policy_init_stream(self):
        """The seed stream of policy carries: 'init' as in the original with
        one process; with replicas 'policy', so that the 'init' stream, which
        the learner's collective calls read, advances alike on every
        replica however often each one's actor starts carries."""
        return 'policy' if jax.process_count() > 1 else 'init'

    def _local_rows(self, batch_size):
        """This host's rows of a global batch of `batch_size` rows."""
        return batch_size // jax.process_count()

    def _host_params(self, params):
        """With several replicas, the parameters as arrays on this host's
        devices (the policy mesh is local): the value of each replicated
        global array. One process: as given."""
        if jax.process_count() == 1:
            return params
        split = [k for k, v in params.items() if not v.is_fully_replicated]
        if split:  # Refused when the agent is built; see above.
            raise meshlib.LayoutError(
                f"With several replicas the policy parameters must be "
                f"replicated on the train mesh ({self._train_layout.key} "
                f"'{self._train_layout.text}'), but {', '.join(split[:3])} "
                f"are split by the partition rules.")
        return {k: fetch.host_local(v) for k, v in params.items()}

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
            params = self._host_params(params)
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

    def _batch_to_device(self, data):
        return _OnDevice(self._prepare_batch(data, 'stream'))

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

    def _seed(self, name):
        with self._seed_lock:
            count = self._calls[name]
            self._calls[name] = count + 1
        index = SEED_STREAMS.index(name)
        entropy = [self._seed_base, index, count]
        if name == 'policy' and jax.process_count() > 1:
            # Each replica acts in its own envs with its own randomness; the
            # learner's streams stay the same on every replica.
            entropy.append(jax.process_index())
        sequence = np.random.SeedSequence(entropy)
        return sequence.generate_state(2).astype(np.uint32)

    def _rng_state(self):
        with self._seed_lock:
            state = {f'rng/{k}': np.int64(v) for k, v in self._calls.items()}
            state['rng/seed'] = np.int64(self._seed_base)
        return state

    def _set_rng_state(self, values):
        with self._seed_lock:
            if 'rng/seed' in values:
                self._seed_base = int(values['rng/seed'])
            for name in SEED_STREAMS:
                if f'rng/{name}' in values:
                    self._calls[name] = int(values[f'rng/{name}'])

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


#: Seconds between the agent's lines while it compiles.
PROGRESS_EVERY = 30

#: The agents' background compile threads; Python waits for them at exit.
_COMPILING = weakref.WeakSet()


def _say_exit_waits():
    """At exit (before Python joins the threads): one line when a compile
    still runs, which the process waits for."""
    alive = [t for t in list(_COMPILING) if t.is_alive()]
    if alive:
        print('Agent: waiting for train and report to finish compiling '
              'before this process exits (XLA cannot stop a compile).',
              flush=True)


threading._register_atexit(_say_exit_waits)


class _CompileProgress:
    """Prints what the agent compiles every `PROGRESS_EVERY` seconds, with
    the seconds since compiling started, until `stop()`."""

    def __init__(self):
        self._start = None
        self._what = ''
        self._done = threading.Event()

    def start(self, what):
        self._start = time.monotonic()
        self._what = what
        threading.Thread(
            target=self._report, name='AgentCompileProgress',
            daemon=True).start()

    def phase(self, what):
        self._what = what

    def elapsed(self):
        return 0.0 if self._start is None else time.monotonic() - self._start

    def stop(self):
        self._done.set()

    def _report(self):
        while not self._done.wait(PROGRESS_EVERY):
            print(f'Agent: compiling {self._what}, {self.elapsed():.0f} s '
                  f'since compiling started.', flush=True)


def _cache_text(path):
    """The compilation cache at `path` in words: off, or whether it holds
    programs (warm for those compiled before) or none (a cold start)."""
    if not path:
        return 'the compilation cache is off (EMBODIED_JAX_CACHE=off)'
    try:
        entries = sum(1 for _ in os.scandir(path))
    except OSError:
        entries = 0
    if not entries:
        return f'the compilation cache at {path} is empty (a cold start)'
    return (f'the compilation cache at {path} holds {entries} entries '
            f'(warm for programs compiled there before)')


@jax.jit
def _copy_arrays(tree):
    return jax.tree.map(jnp.copy, tree)


def _signature(tree):
    """The structure of `tree`, the shapes and dtypes of its arrays and the
    values of its other leaves (static arguments): what decides whether jit
    compiles anew."""
    leaves, structure = jax.tree.flatten(tree)
    return structure, tuple(
        (x.shape, str(x.dtype)) if hasattr(x, 'shape') else repr(x)
        for x in leaves)


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


def _cut(carry, rows, split):
    """The first `rows` rows of a policy carry; a stacked carry cut with
    `split` becomes per-row lists."""
    if split:
        return jax.tree.map(lambda xs: xs[:rows], carry, is_leaf=_islist)
    return jax.tree.map(lambda x: x[:rows], carry)


class _OnDevice(dict):
    """A batch `stream()` moved to the train devices already."""

