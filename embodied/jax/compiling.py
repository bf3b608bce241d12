"""Tracing and compiling the agent's programs ahead of their first calls.

Every trace of an agent's function runs under `TRACE_LOCK`. A `Compiler`
compiles what building the agent compiles (see "Compiling ahead" in
docs/agents.md): the policy at `policy_batches` before the agent is
returned, then train and report (in the background thread 'AgentCompile'
with one replica), and later any policy size that no compiled size fits.
"""

import bisect
import collections
import contextlib
import functools
import os
import threading
import time
import weakref

import jax
import numpy as np

from embodied.core import outofmemory

from . import distributed
from . import hosts

#: Held by every trace of an agent's function in this process: ninjax keeps
#: its name scope in a process-wide variable, so two traces at once (say the
#: actor's first policy and the learner's first train) corrupt each other.
#: Reentrant, as a trace may start another.
TRACE_LOCK = threading.RLock()

#: The seed given when compiling ahead: no random stream advances.
LOWERING_SEED = np.zeros(2, np.uint32)

#: Seconds between the agent's lines while it compiles.
PROGRESS_EVERY = 30

#: The agents' background compile threads; Python waits for them at exit.
_COMPILING = weakref.WeakSet()

#: The part of the agent that agents built in this process compile ahead
#: (`building`): None (all), 'policy' or 'learner'.
_PART = None
PARTS = (None, 'policy', 'learner')


@contextlib.contextmanager
def building(part):
    """Agents built inside compile ahead only `part` of their programs:
    'policy' (a process that only acts: no train or report) or 'learner'
    (one whose policy acts in another process: no policy). The parallel
    runner's agent and policy processes build their agents inside it."""
    global _PART
    assert part in PARTS, part
    previous, _PART = _PART, part
    try:
        yield
    finally:
        _PART = previous


def traced_under_lock(fn):
    """`fn` run under `TRACE_LOCK`; for the functions given to `jax.jit`,
    whose Python body only runs when JAX traces them."""
    @functools.wraps(fn)
    def locked(*args, **kwargs):
        with TRACE_LOCK:
            return fn(*args, **kwargs)
    return locked


def compiles_learner(config):
    """Whether building the agent compiles train and report ahead: with a
    batch to compile them for, unless the runner never trains."""
    return bool(config.get('batch_size') and config.get('batch_length')
                and config.get('trains', True) and _PART != 'policy')


def policy_batches(config, enable_policy=True):
    """The policy's batch sizes to compile ahead, {mode: sorted sizes}, from
    `config.policy_batches`; none for an agent without a policy."""
    if not enable_policy or _PART == 'learner':
        return {}
    return {
        mode: sorted({int(x) for x in sizes}) for mode, sizes in
        dict(config.get('policy_batches', {})).items() if sizes}


def _sizes_text(policy):
    """Policy batch sizes per mode in words: 'train [1, 4], eval [1]'."""
    return ', '.join(f'{mode} {sizes}' for mode, sizes in policy.items())


def _say_exit_waits():
    print('Agent: waiting for train and report to finish compiling '
          'before this process exits (XLA cannot stop a compile).',
          flush=True)


def _say_exit_waits_if_compiling():
    """At exit (before Python joins the threads): one line when a compile
    still runs, which the process waits for."""
    if any(t.is_alive() for t in list(_COMPILING)):
        _say_exit_waits()


threading._register_atexit(_say_exit_waits_if_compiling)


class Progress:
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


def cache_text(path):
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


class Compiler:
    """Compiles an agent's jitted functions ahead of their first calls and
    tells the learner when train and report are ready. It reads the agent's
    jitted functions (`_jit_*`), state, layouts and batch helpers; with
    `enabled` False (no `jax.precompile`, or no jit) it compiles nothing
    and train and report count as compiled at once."""

    def __init__(self, agent, enabled):
        self.agent = agent
        self.enabled = enabled
        # Sorted batch sizes the policy is compiled for, per mode.
        self.policy_sizes = collections.defaultdict(list)
        self.active = False  # Set while compiling ahead, under TRACE_LOCK.
        # Set once train (report) is compiled; the learner's calls wait.
        self.compiled = {'train': threading.Event(),
                         'report': threading.Event()}
        self.error = None
        self.thread = None
        self.progress = Progress()

    # Building the agent

    def announce(self, config):
        """Says what building the agent compiles and starts the progress
        lines (before the parameters are made)."""
        if not self.enabled:
            return
        print(f'Agent: compiling {self._plan(config)}; '
              f'{cache_text(self.agent.runtime.cache_dir)}.', flush=True)
        self.progress.start('the parameters')

    def ahead(self, config):
        """Compiles the policy at `config.policy_batches` now, then what the
        learner calls at the configured shapes: in a background thread, or
        here with several replicas, which meet at barriers while they
        compile. Without `enabled`, marks train and report compiled."""
        if not self.enabled:
            self._mark_compiled()
            return
        policy = policy_batches(config, self.agent.runtime.enable_policy)
        learner = compiles_learner(config)
        self.progress.phase('the policy' if policy else 'train and report')
        for mode, sizes in policy.items():
            self.compile_policy(sizes, [mode], announce=False)
        policy_seconds = self.progress.elapsed()
        text = _sizes_text(policy)
        if policy and learner:
            print(
                f'Agent: the policy is compiled (batch sizes {text}) '
                f'{policy_seconds:.1f} s after the start; train and report '
                f'compile while it acts.', flush=True)

        def compile_learner():
            try:
                if learner:
                    self.learner(config)
            finally:
                self.progress.stop()
            self._say_compiled(learner, policy_seconds, text)

        if distributed.started() or not learner:
            try:
                compile_learner()
            finally:
                self._mark_compiled()
            return
        self._start_thread(compile_learner)

    def stop(self):
        """Ends the progress lines (building the agent failed)."""
        self.progress.stop()

    def _plan(self, config):
        """What building the agent compiles, in order, in words."""
        parts = ['the parameters']
        policy = policy_batches(config, self.agent.runtime.enable_policy)
        if policy:
            parts.append(f'the policy at batch sizes {_sizes_text(policy)}')
        if compiles_learner(config):
            where = ('' if distributed.started() else
                     ' in the background while the policy acts')
            parts.append(f'then train and report{where}')
        return ', '.join(parts)

    def _say_compiled(self, learner, policy_seconds, text):
        """The line that ends compiling, with the seconds train and report
        took (when `learner` compiled them) and the policy's sizes."""
        total = self.progress.elapsed()
        parts = []
        if learner:
            parts.append(f'train and report {total - policy_seconds:.1f} s')
        if text:
            parts.append(f'policy at batch sizes {text}')
        print(f'Compiled the agent in {total:.1f} s'
              + (f' ({"; ".join(parts)})' if parts else '') + '.',
              flush=True)

    def _start_thread(self, fn):
        # Never a daemon, even when the agent is built on a daemon thread
        # (whose daemon flag a new thread inherits): XLA cannot stop a
        # compile, and a daemon thread that ends its compile while Python
        # shuts down aborts the process ('exception not rethrown').
        def run():
            try:
                fn()
            except BaseException as e:
                self.error = e  # Raised again by the learner's next call.
                print(f'Agent: compiling train and report failed: '
                      f'{type(e).__name__}: {e}', flush=True)
            finally:
                self._mark_compiled()
        self.thread = threading.Thread(
            target=run, name='AgentCompile', daemon=False)
        self.thread.start()
        _COMPILING.add(self.thread)

    def _mark_compiled(self):
        for event in self.compiled.values():
            event.set()

    # The learner's programs

    def learner(self, config):
        """Compiles `init_train` and `train`, then `init_report` and
        `report`, marking each pair compiled. Each program is lowered under
        `TRACE_LOCK` and compiled by XLA outside it (XLA releases the GIL),
        so the actor's threads act meanwhile; no state lock is held while
        XLA compiles, so saves, loads and train steps go on too."""
        agent = self.agent
        batch = hosts.global_rows(int(config.batch_size))
        context = int(config.get('replay_context', 0))
        train_length = int(config.batch_length) + context
        report_length = int(config.get(
            'report_length', config.batch_length)) + context
        agent._train_layout.check_batch(batch, 'batch_size')
        for name, init, step, length in (
                ('train', agent._jit_init_train, agent._jit_train,
                 train_length),
                ('report', agent._jit_init_report, agent._jit_report,
                 report_length)):
            self.progress.phase(name)
            with outofmemory.in_program(name):
                self._compile_learner_program(
                    name, init, step, batch, length)
            if name == 'train':  # Report's is set once the line is out.
                self.compiled[name].set()

    def _compile_learner_program(self, name, init, step, batch, length):
        """Compiles `init` (init_train or init_report) and `step` (train
        or report) for `batch` rows of `length` steps."""
        agent, seed = self.agent, LOWERING_SEED
        # Lowering reads only the state's shapes and layout, which stay
        # valid after train donated its arrays: no state lock, so saves
        # and train steps go on while this thread traces.
        self.lower(init, agent._state, seed, batch).compile()
        # A collective: replicas run it together, as gloo allows a late
        # one 30 s (see hosts.FirstRuns).
        distributed.barrier(f'compiled-ahead-{name}')
        data = agent._zero_batch(batch, length)
        with agent._state_lock:  # Runs on the arrays of the moment.
            carry = jax.device_put(
                init(agent._state, seed, batch), agent._train_batch)
        self.lower(step, agent._state, carry, data, seed).compile()

    def lower(self, jitted, *args):
        """`jitted` lowered for `args` under `TRACE_LOCK` (a trace, not a
        new shape the learner met)."""
        with TRACE_LOCK:
            self.active = True
            try:
                return jitted.lower(*args)
            finally:
                self.active = False

    def wait(self, timeout=None, report=False):
        """Whether `train` (with `report`, also `report`) is compiled,
        waiting up to `timeout` seconds (None: until it is). Raises the
        error of a failed compile."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self.wait_for('train', timeout):
            return False
        if not report:
            return True
        left = None if deadline is None else max(
            0.0, deadline - time.monotonic())
        return self.wait_for('report', left)

    def wait_for(self, name, timeout=None):
        """Whether `name` ('train' or 'report') is compiled, waiting up to
        `timeout` seconds; raises the error of a failed compile."""
        done = self.compiled[name].wait(timeout)
        if done and self.error is not None:
            raise RuntimeError(
                f'Compiling {name} failed: {type(self.error).__name__}: '
                f'{self.error}') from self.error
        return done

    def finish(self):
        """Waits for the background compile, saying so when it still runs."""
        if self.thread is None or not self.thread.is_alive():
            return
        _say_exit_waits()
        self.thread.join()

    # The policy's programs

    def ensure_policy(self, size):
        """Compiles the policy (mode train) at `size` unless some mode has
        it compiled."""
        compiled = any(size in s for s in self.policy_sizes.values())
        if self.enabled and not compiled:
            self.compile_policy([size], ['train'])

    def policy_size(self, rows, mode):
        """The compiled batch size a policy call of `rows` rows runs at,
        compiling one (under the trace lock) when none fits."""
        if not self.enabled:
            return rows
        sizes = self.policy_sizes[mode]
        index = bisect.bisect_left(sizes, rows)
        if index < len(sizes):
            return sizes[index]
        devices = self.agent._policy_layout.data_size
        size = -(-rows // devices) * devices
        self.compile_policy([size], [mode])
        return size

    @outofmemory.program('policy')
    def compile_policy(self, sizes, modes, announce=True):
        """Compiles `init_policy` and `policy` (for stacked carries and for
        per-row ones) at each batch size for each mode."""
        with TRACE_LOCK:  # Also keeps two threads from compiling one size.
            self.active = True
            try:
                start = time.monotonic()
                for size in sizes:
                    self._compile_policy_size(size, modes)
            finally:
                self.active = False
        if announce:
            print(
                f'Compiled the policy at batch sizes {sizes} in mode '
                f'{", ".join(modes)} in {time.monotonic() - start:.1f} s.',
                flush=True)

    def _compile_policy_size(self, size, modes):
        agent = self.agent
        params, seed = agent._policy_params, LOWERING_SEED
        agent._policy_layout.check_batch(size, 'policy batch size')
        agent._jit_init_policy.lower(params, seed, size).compile()
        carry = jax.device_put(
            agent._jit_init_policy(params, seed, size), agent._policy_batch)
        obs = agent._prepare_obs(
            {k: np.zeros((size, *v.shape), v.dtype)
             for k, v in agent.obs_space.items()}, size, size)
        for mode in modes:
            if size in self.policy_sizes[mode]:
                continue
            # Per-row carries as the actor holds them: rows of an earlier
            # policy call's output.
            rows, _, _ = agent._jit_policy(
                params, carry, obs, seed, mode=mode, split=True)
            for split, value in ((False, carry), (True, rows)):
                agent._jit_policy.lower(
                    params, value, obs, seed, mode=mode,
                    split=split).compile()
            bisect.insort(self.policy_sizes[mode], size)
