"""A CPU model of one GPU for the one-GPU benchmark (`one_gpu.py`).

`SerialDevice` is the device: work items run on a thread of their own,
each for a given time, in the order a `Scheduler` gives. The items of one
process are one context and run first in, first out (as XLA's GPU client
runs every program of a process for a device on one stream, in submission
order); a second process is a second context (`DeviceServer`,
`RemoteDevice`), and contexts take turns in the device's time slices,
calibrated so that the model reproduces `gpu_check`'s probe of a policy
in a second process on the H200 (`probe`).
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
copied every `copy_every` updates), `trace` (a file the device appends
its cumulative counters to, a JSON line every `trace_every` seconds),
`device_socket` (a Unix socket path: the first process that builds the
agent serves its device there, and an agent built in another process,
the policy process of `run.policy_process process`, uses it as a second
context), `slice_ms` (the device's time slice between contexts),
`policy_device_ms` (of a policy call's `policy_ms` in a policy process,
the part that runs on the device; the rest, split in two halves around
it, is the host's and runs beside the other context's programs) and
`policy_process` (true: the agent of each process plays its part of
`run.policy_process process`: the learner's process counts its updates
on the device and a thread of it publishes each finished copy of the
parameters (device to host, `copy_ms`); the policy process, before a
call that finds a newer copy published, copies it to the device
(`copy_ms`, in its own context) and acts with it; the lag is the
learner's updates minus the version acted with).

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
import math
import os
import sys
import threading
import time

OPTIONS = 'EMBODIED_SIMULATED_GPU'
ENV_MS = 'EMBODIED_SIMULATED_ENV_MS'
DEFAULTS = dict(
    train_ms=49.0, policy_ms=2.1, policy_rows=16, policy_scale=1.0,
    report_ms=49.0, copy_ms=0.05, split=[1.0], host_policy_ms=0.0,
    copy_every=1, trace='', trace_every=0.5, device_socket='',
    slice_ms=1.1, policy_device_ms=0.24, policy_process=False)


class Scheduler:
    """Which work item runs on the device when, in device seconds. Items of
    one context (one process's stream) run first in, first out; contexts
    take turns in the device's time slices of `slice_s` (one grid from
    time 0): the running context keeps the device to the end of a slice in
    which another context has work, or until it has no work itself. One context is one stream (JAX's programs
    of one process on one GPU); two are two processes on it.
    `advance(now)` runs the device up to `now` and returns the items that
    finished; `next_event()` is the device time at which the next one ends
    or a slice is up (None while idle)."""

    EPS = 1e-12

    def __init__(self, slice_s=0.001):
        self.slice_s = slice_s
        self.queues = collections.OrderedDict()  # context -> deque of items
        self.now = 0.0
        self.active = None
        self.slice_end = 0.0
        self.busy = collections.Counter()
        self.items = collections.Counter()

    def submit(self, context, kind, seconds, now):
        """Queues an item of `seconds` in `context` at device time `now`;
        returns it, a list [kind, seconds left, payload]."""
        finished = self.advance(now)
        item = [kind, float(seconds), None]
        self.queues.setdefault(context, collections.deque()).append(item)
        return item, finished

    def _others(self, context):
        return [c for c, q in self.queues.items() if q and c != context]

    def _boundary(self):
        """The end of the current slice: slices are the device's, on one
        grid from time 0, whoever runs."""
        return (math.floor(self.now / self.slice_s + self.EPS) + 1) * (
            self.slice_s)

    def _decide(self):
        """(context, end of its slice) to run at `now`; (None, None) idle."""
        mine = self.active is not None and self.queues.get(self.active)
        others = self._others(self.active)
        if mine and (not others or self.now < self.slice_end - self.EPS):
            return self.active, self._boundary()
        if others:
            return others[0], self._boundary()
        return None, None

    def next_event(self):
        context, end = self._decide()
        if context is None:
            return None
        stop = self.now + self.queues[context][0][1]
        return min(stop, end) if self._others(context) else stop

    def advance(self, now):
        """Runs the device up to `now`; the items that finished, in order."""
        finished = []
        while True:
            context, end = self._decide()
            if context is None:
                self.now = max(self.now, now)
                return finished
            if context != self.active:
                self.active = context
                self.queues.move_to_end(context)  # Last in the turns.
            self.slice_end = end
            item = self.queues[context][0]
            stop = self.now + item[1]
            if self._others(context):
                stop = min(stop, end)
            stop = min(stop, max(now, self.now))
            ran = stop - self.now
            self.busy[item[0]] += ran
            item[1] -= ran
            self.now = stop
            if item[1] <= self.EPS:
                self.queues[context].popleft()
                self.items[item[0]] += 1
                finished.append(item)
            elif stop >= now:
                return finished


class SerialDevice:
    """The simulated GPU in real time: `submit(kind, ms, context)` queues a
    work item and returns a `threading.Event` set when it has run; a
    `Scheduler` decides the order (first in, first out within a context,
    contexts time-sliced by `slice_ms`). Counts busy seconds and items per
    kind, and appends the counters to `trace` as JSON lines."""

    def __init__(self, trace='', trace_every=0.5, slice_ms=1.0):
        self._cond = threading.Condition()
        self._scheduler = Scheduler(slice_ms / 1000)
        # Device time 0 is this moment; an item that overslept ends on the
        # device's own clock, so the busy time is the items' times.
        self._origin = time.monotonic()
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

    @property
    def busy(self):
        return self._scheduler.busy

    @property
    def items(self):
        return self._scheduler.items

    def _now(self):
        return time.monotonic() - self._origin

    def submit(self, kind, ms, context=0):
        done = threading.Event()
        with self._cond:
            if self._closed:  # The run is ending: nothing waits for it.
                done.set()
                return done
            item, finished = self._scheduler.submit(
                context, kind, ms / 1000, self._now())
            item[2] = done
            self._finish(finished + self._scheduler.advance(self._now()))
            self._cond.notify()
        return done

    def run(self, kind, ms, context=0):
        """Submits an item and waits for it and everything before it in its
        context."""
        self.submit(kind, ms, context).wait()

    def count(self, **values):
        with self._cond:
            self.extra.update(values)

    def shared(self):
        """The counters the agents add (`count`), now."""
        with self._cond:
            return dict(self.extra)

    def _finish(self, items):
        for item in items:
            item[2].set()

    def _run(self):
        with self._cond:
            while not self._closed:
                self._finish(self._scheduler.advance(self._now()))
                end = self._scheduler.next_event()
                timeout = None if end is None else max(0.0, end - self._now())
                if timeout is None or timeout > 0:
                    self._cond.wait(timeout)

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
        """Stops the device; what it still had to run counts as run, so
        that no other process's call waits for it."""
        with self._cond:
            self._closed = True
            for queue in self._scheduler.queues.values():
                self._finish(queue)
                queue.clear()
            self._cond.notify()
        server = getattr(self, 'server', None)
        if server is not None:
            server.listener.close()


class DeviceServer:
    """Serves a `SerialDevice` to other processes at the Unix socket
    `path`: each connection is one more context (a process's stream).
    Requests: ('submit', kind, ms), answered in order, each once its item
    ran, with the device's shared counters then; ('count', values), not
    answered."""

    def __init__(self, device, listener):
        self.device, self.listener = device, listener
        self._contexts = 0
        threading.Thread(target=self._accept, name='simulated_gpu_server',
                         daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn = self.listener.accept()
            except OSError:
                return
            self._contexts += 1
            threading.Thread(
                target=self._serve, args=(conn, f'process{self._contexts}'),
                daemon=True).start()

    def _serve(self, conn, context):
        import queue
        submitted = queue.Queue()
        threading.Thread(target=self._answer, args=(conn, submitted),
                         daemon=True).start()
        try:
            while True:
                request = conn.recv()
                if request[0] == 'submit':
                    submitted.put(
                        self.device.submit(request[1], request[2], context))
                else:
                    self.device.count(**request[1])
        except (EOFError, OSError):
            submitted.put(None)

    def _answer(self, conn, submitted):
        """Answers the connection's items in order (a context's items
        finish first in, first out)."""
        while (done := submitted.get()) is not None:
            done.wait()
            try:
                conn.send(self.device.shared())
            except OSError:
                break
        conn.close()


class RemoteDevice:
    """A `SerialDevice` of another process (its `DeviceServer`), as a
    context of its own: one connection, whose requests from this process's
    threads queue in order, as the programs of one process do on its one
    stream. Once the serving process is gone, every item counts as run at
    once (the run is ending)."""

    def __init__(self, path):
        self.path = path
        self._lock = threading.Lock()
        self._conn = None
        self._pending = collections.deque()
        self._shared = {}
        self._gone = False

    def _connection(self):
        """The connection, made on first use (under `_lock`)."""
        from multiprocessing import connection
        if self._conn is None:
            self._conn = connection.Client(self.path, 'AF_UNIX')
            threading.Thread(target=self._read, args=(self._conn,),
                             name='simulated_gpu_client', daemon=True).start()
        return self._conn

    def connect(self):
        with self._lock:
            self._connection()

    def submit(self, kind, ms, context=0):
        done = threading.Event()
        with self._lock:
            if not self._gone:
                self._pending.append(done)
                try:
                    self._connection().send(('submit', kind, ms))
                    return done
                except OSError:
                    self._pending.pop()
        done.set()
        return done

    def run(self, kind, ms, context=0):
        self.submit(kind, ms, context).wait()

    def count(self, **values):
        with self._lock:
            if not self._gone:
                try:
                    self._connection().send(('count', values))
                except OSError:
                    pass

    def shared(self):
        """The device's shared counters at its last answer."""
        return dict(self._shared)

    def _read(self, conn):
        while True:
            try:
                shared = conn.recv()
            except (EOFError, OSError):
                break
            with self._lock:
                self._shared = shared
                done = self._pending.popleft()
            done.set()
        with self._lock:
            self._gone = True
            pending, self._pending = self._pending, collections.deque()
        for done in pending:
            done.set()

    def close(self):
        with self._lock:
            if self._conn is not None:
                self._conn.close()


def shared_device(options):
    """The device of this process's agent: with the option `device_socket`
    the first process to bind that path makes the device and serves it, and
    others use it as contexts of their own (`RemoteDevice`); without it, a
    device of its own. Returns (device, whether it is remote)."""
    path = options['device_socket']
    local = lambda: SerialDevice(
        options['trace'], options['trace_every'], options['slice_ms'])
    if not path:
        return local(), False
    from multiprocessing import connection
    try:
        listener = connection.Listener(path, 'AF_UNIX')
    except OSError:  # Another process serves it.
        device = RemoteDevice(path)
        device.connect()
        return device, True
    device = local()
    device.server = DeviceServer(device, listener)
    return device, False


def probe(train_ms, policy_ms, policy_device_ms, slice_ms, calls=200,
          warmup=20, jitter=0.5, seed=0):
    """The policy probe of `gpu_check` on the model, in device time: one
    process trains back to back (two updates always queued) while another
    calls the policy back to back. A call takes `policy_ms` alone:
    `policy_device_ms` on the device in its process's context, between two
    equal host parts (launch; reading the actions back), each varying by
    +-`jitter` of itself (uniform, seeded), so that calls reach the device
    at any point of its slices, as real ones do. Returns the policy's p50
    and p95 ms and the learner's rate as % of standalone, over `calls`
    calls after `warmup`."""
    import random
    rng = random.Random(seed)
    scheduler = Scheduler(slice_ms / 1000)
    half = (policy_ms - policy_device_ms) / 2000
    host = lambda: half * rng.uniform(1 - jitter, 1 + jitter)
    for _ in range(2):
        scheduler.submit('learner', 'train', train_ms / 1000, 0.0)
    latencies, start, busy0, time0 = [], 0.0, 0.0, 0.0
    launched, returned = host(), None  # When the host parts end.
    while len(latencies) < warmup + calls:
        now = min(e for e in (scheduler.next_event(), launched, returned)
                  if e is not None)
        for item in scheduler.advance(now):
            if item[0] == 'train':
                scheduler.submit('learner', 'train', train_ms / 1000, now)
            else:
                returned = now + host()
        if launched is not None and now >= launched - Scheduler.EPS:
            launched = None
            scheduler.submit('policy', 'policy', policy_device_ms / 1000, now)
        if returned is not None and now >= returned - Scheduler.EPS:
            latencies.append(now - start)
            if len(latencies) == warmup:
                busy0, time0 = scheduler.busy['train'], now
            start, launched, returned = now, now + host(), None
    timed = sorted(latencies[warmup:])
    pick = lambda q: 1000 * timed[min(len(timed) - 1, int(q * len(timed)))]
    learner = 100 * (scheduler.busy['train'] - busy0) / (now - time0)
    return dict(p50=pick(0.5), p95=pick(0.95), learner=learner)


def _options():
    options = dict(DEFAULTS)
    options.update(json.loads(os.environ.get(OPTIONS, '{}') or '{}'))
    unknown = set(options) - set(DEFAULTS)
    if unknown:
        raise KeyError(
            f'{OPTIONS}: unknown options {sorted(unknown)}; known: '
            f'{", ".join(DEFAULTS)}.')
    return options


class _OnSerialDevice:
    """`SimulatedGPUAgent`'s methods over those of the test agent: train,
    report and policy on a `SerialDevice`."""

    def __init__(self, obs_space, act_space, config):
        super().__init__(obs_space, act_space, config)
        self.options = _options()
        self.device, self.remote = shared_device(self.options)
        self._updates = 0
        self._acting_version = 0
        self._copy = None  # (version, done) of the copy on its way.
        self._version_lock = threading.Lock()
        if self.options['policy_process']:
            import queue
            self._to_publish = queue.Queue()
            threading.Thread(target=self._publish, daemon=True,
                             name='simulated_gpu_publish').start()

    def policy(self, carry, obs, mode='train'):
        rows = len(obs['is_first'])
        start = time.monotonic()
        if self.options['host_policy_ms'] > 0:
            time.sleep(self.options['host_policy_ms'] / 1000)
            lag = self._thread_lag()
        elif self.options['policy_process']:
            lag = self._act_apart(rows)
        else:
            self.device.run('policy', self._policy_ms(rows))
            lag = self._thread_lag()
        waited = time.monotonic() - start
        self.device.count(
            policy_calls=1, policy_rows=rows, policy_seconds=waited,
            lag_sum=lag)
        return super().policy(carry, obs, mode)

    def _thread_lag(self):
        with self._version_lock:
            self._take_copy()
            return self._updates - self._acting_version

    def _act_apart(self, rows):
        """A policy call in a policy process: the host's part of the
        call runs beside the other process's programs; a newer copy of
        the parameters goes to the device first. Returns its lag."""
        options = self.options
        total = self._policy_ms(rows)
        device = total * options['policy_device_ms'] / options['policy_ms']
        time.sleep((total - device) / 2000)
        published = self.device.shared().get('published', 0)
        if published > self._acting_version:
            self.device.submit('copy', options['copy_ms'])
            self._acting_version = published
        self.device.run('policy', device)
        lag = self.device.shared().get('updates', 0) - self._acting_version
        time.sleep((total - device) / 2000)
        return lag

    def train(self, carry, data):
        carry, outs, metrics = super().train(carry, data)
        done = None
        for part in self.options['split']:
            if done:  # The next program once the last one has run.
                done.wait()
            done = self.device.submit(
                'train', self.options['train_ms'] * part)
        if self.options['policy_process']:  # For the policy's lag.
            self.device.count(updates=1)
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
        if self.options['policy_process']:
            self._to_publish.put(self._copy)

    def _publish(self):
        """The learner's side of a policy process: a thread publishes
        each copy once it reached the host, off the train loop."""
        published = 0
        while True:
            version, done = self._to_publish.get()
            done.wait()
            self.device.count(published=version - published)
            published = version

    def _take_copy(self):
        if self._copy is not None and self._copy[1].is_set():
            self._acting_version = self._copy[0]
            self._copy = None


def _make_agent_class():
    from embodied.agents import testing

    class SimulatedGPUAgent(_OnSerialDevice, testing.TestAgent):
        """The test agent with train, report and policy on a
        `SerialDevice`; see the module docstring."""

        banner = ['SimulatedGPUAgent: the test agent on one simulated GPU']

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
