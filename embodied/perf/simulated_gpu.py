"""A CPU model of one GPU for the one-GPU benchmark (`one_gpu.py`).

`SerialDevice` is one compute stream: work items run first in, first out,
each for a given time, on a thread of their own (as XLA's GPU client runs
every program for a device on one stream, in submission order).
`SimulatedGPUAgent` is the numpy test agent with its `train`, `report` and
`policy` put on such a device the way our JAX agent (`embodied.jax.Agent`)
puts them on a GPU:

* `train` submits the update and returns at once (async dispatch); its
  `outs` and `metrics` wait for the update when first read, as
  `fetch.Fetched` does. After each update a copy of the policy's parameters
  is submitted unless the last copy is still on its way (as
  `handover.PolicyParams.offer`); the policy acts with the newest finished
  copy and the lag of that copy is recorded.
* `policy` submits a policy program and waits for it (the actions are read
  back); `report` and `save` wait for everything submitted before them.
* `stream` reads batches ahead in a background thread, 2 at most.

Options (one JSON object in the variable `EMBODIED_SIMULATED_GPU`, read
when the agent is built): `train_ms`, `policy_ms` (a policy call of up to
`policy_rows` rows; above that, `policy_ms` grows by `policy_scale` per
extra row as a fraction of `policy_ms / policy_rows`), `report_ms`,
`copy_ms`, `split` (a list of fractions: the update as that many programs,
e.g. [0.6, 0.4] for world model then actor-critic; `train` submits each
once the one before has run, so that policy calls that came meanwhile run
between them), `host_policy_ms` (> 0:
the policy runs on the host for that long, off the device, with parameters
copied every `copy_every` updates), and `trace` (a file the device appends
its cumulative counters to, a JSON line every `trace_every` seconds).

Env steps take time too: with `EMBODIED_SIMULATED_ENV_MS` set, `install()`
(called from the `sitecustomize.py` that `one_gpu.py` writes into the
processes' path) makes each step of the dummy env take that many ms, in
every process of the run, so that the benchmark also runs on trees that
have no such option. This module imports only what every tree of the
package has (the test agent, the dummy env), and runs as a top-level
module copied next to that `sitecustomize.py`.
"""

import collections
import collections.abc
import json
import os
import sys
import threading
import time

OPTIONS = 'EMBODIED_SIMULATED_GPU'
ENV_MS = 'EMBODIED_SIMULATED_ENV_MS'
DEFAULTS = dict(
    train_ms=49.0, policy_ms=2.1, policy_rows=16, policy_scale=1.0,
    report_ms=49.0, copy_ms=0.05, split=[1.0], host_policy_ms=0.0,
    copy_every=1, trace='', trace_every=0.5)


class SerialDevice:
    """One compute stream: `submit(kind, ms)` queues a work item; items run
    one at a time in submission order, each for its time. Returns a
    `threading.Event` set when the item has run. Counts busy seconds and
    items per kind, and appends the counters to `trace` as JSON lines."""

    def __init__(self, trace='', trace_every=0.5):
        self._queue = collections.deque()
        self._cond = threading.Condition()
        self._clock = 0.0  # When the device is free: the last item's end.
        self.busy = collections.Counter()
        self.items = collections.Counter()
        self.extra = collections.Counter()  # Counters the agent adds.
        self._trace, self._trace_every = trace, trace_every
        self._closed = False
        self._thread = threading.Thread(
            target=self._run, name='simulated_gpu', daemon=True)
        self._thread.start()
        if trace:
            threading.Thread(
                target=self._write_trace, name='simulated_gpu_trace',
                daemon=True).start()

    def submit(self, kind, ms):
        done = threading.Event()
        with self._cond:
            self._queue.append((kind, ms / 1000, done))
            self._cond.notify()
        return done

    def run(self, kind, ms):
        """Submits an item and waits for it and everything before it."""
        self.submit(kind, ms).wait()

    def count(self, **values):
        with self._cond:
            self.extra.update(values)

    def _run(self):
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                kind, seconds, done = self._queue.popleft()
            # Items end on the device's own clock: an oversleep of one item
            # is taken from the next one that was already waiting, so the
            # busy time is the items' times, not the sleeps'.
            start = max(time.monotonic(), self._clock)
            self._clock = start + seconds
            delay = self._clock - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            with self._cond:
                self.busy[kind] += seconds
                self.items[kind] += 1
            done.set()

    def snapshot(self):
        with self._cond:
            return {
                'time': time.monotonic(), 'busy': dict(self.busy),
                'items': dict(self.items), **dict(self.extra)}

    def _write_trace(self):
        while not self._closed:
            with open(self._trace, 'a') as f:
                f.write(json.dumps(self.snapshot()) + '\n')
            time.sleep(self._trace_every)

    def close(self):
        with self._cond:
            self._closed = True
            self._cond.notify()


def _options():
    options = dict(DEFAULTS)
    options.update(json.loads(os.environ.get(OPTIONS, '{}') or '{}'))
    unknown = set(options) - set(DEFAULTS)
    if unknown:
        raise KeyError(
            f'{OPTIONS}: unknown options {sorted(unknown)}; known: '
            f'{", ".join(DEFAULTS)}.')
    return options


def _make_agent_class():
    from embodied.agents import testing

    class SimulatedGPUAgent(testing.TestAgent):
        """The test agent with train, report and policy on a
        `SerialDevice`; see the module docstring."""

        banner = ['SimulatedGPUAgent: the test agent on one simulated GPU']

        def __init__(self, obs_space, act_space, config):
            super().__init__(obs_space, act_space, config)
            self.options = _options()
            self.device = SerialDevice(
                self.options['trace'], self.options['trace_every'])
            self._updates = 0
            self._acting_version = 0
            self._copy = None  # (version, done) of the copy on its way.
            self._version_lock = threading.Lock()

        def policy(self, carry, obs, mode='train'):
            rows = len(obs['is_first'])
            start = time.monotonic()
            if self.options['host_policy_ms'] > 0:
                time.sleep(self.options['host_policy_ms'] / 1000)
            else:
                self.device.run('policy', self._policy_ms(rows))
            waited = time.monotonic() - start
            with self._version_lock:
                self._take_copy()
                lag = self._updates - self._acting_version
            self.device.count(
                policy_calls=1, policy_rows=rows, policy_seconds=waited,
                lag_sum=lag)
            return super().policy(carry, obs, mode)

        def train(self, carry, data):
            carry, outs, metrics = super().train(carry, data)
            done = None
            for part in self.options['split']:
                if done:  # The next program once the last one has run.
                    done.wait()
                done = self.device.submit(
                    'train', self.options['train_ms'] * part)
            with self._version_lock:
                self._updates += 1
                self._offer_copy()
            return carry, _Waiting(outs, done), _Waiting(metrics, done)

        def report(self, carry, data):
            self.device.run('report', self.options['report_ms'])
            return super().report(carry, data)

        def stream(self, st):
            # As our JAX agent: batches read ahead by a background thread
            # (there it also moves them to the device).
            import embodied
            return embodied.streams.Prefetch(st, lambda x: x, amount=2)

        def save(self):
            self.device.run('save', 0.0)
            return super().save()

        def close(self):
            self.device.close()

        def _policy_ms(self, rows):
            options = self.options
            extra = max(0, rows - options['policy_rows'])
            per_row = options['policy_ms'] / options['policy_rows']
            return options['policy_ms'] + extra * per_row * (
                options['policy_scale'])

        def _offer_copy(self):
            """After an update: the policy's copy, unless one is on its way
            (or, for a host policy, not every `copy_every` updates)."""
            self._take_copy()
            if self._copy is not None:
                return
            if self.options['host_policy_ms'] > 0 and (
                    self._updates % self.options['copy_every']):
                return
            self._copy = (self._updates, self.device.submit(
                'copy', self.options['copy_ms']))

        def _take_copy(self):
            if self._copy is not None and self._copy[1].is_set():
                self._acting_version = self._copy[0]
                self._copy = None

    return SimulatedGPUAgent


class _Waiting(collections.abc.Mapping):
    """A result mapping that waits for its device item when first read."""

    def __init__(self, values, done):
        self._values, self._done = values, done

    def __getitem__(self, key):
        self._done.wait()
        return self._values[key]

    def __iter__(self):
        self._done.wait()
        return iter(self._values)

    def __len__(self):
        return len(self._values)


def install():
    """Slows every dummy env step by `EMBODIED_SIMULATED_ENV_MS` ms, in this
    process, once `embodied.envs.dummy` is imported (a no-op without it)."""
    ms = float(os.environ.get(ENV_MS, '0') or 0)
    if ms <= 0:
        return
    sys.meta_path.insert(0, _SlowDummyFinder(ms / 1000))


class _SlowDummyFinder:
    """Import hook: patches `Dummy.step` once the dummy env module loads."""

    name = 'embodied.envs.dummy'

    def __init__(self, seconds):
        self.seconds = seconds

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        import importlib.util
        spec = importlib.util.find_spec(name)
        execute, seconds = spec.loader.exec_module, self.seconds

        def exec_module(module):
            execute(module)
            step = module.Dummy.step

            def slow_step(self, action):
                time.sleep(seconds)
                return step(self, action)
            module.Dummy.step = slow_step

        spec.loader.exec_module = exec_module
        return spec


def __getattr__(name):
    # The agent class is made on first use, so that `install()` (run at
    # interpreter start) imports nothing of the package.
    if name == 'SimulatedGPUAgent':
        cls = _make_agent_class()
        globals()[name] = cls
        return cls
    raise AttributeError(name)
