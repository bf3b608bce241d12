"""The policy's parameters from the learner's devices to a policy process's
devices, through a shared-memory buffer (`rpc.shared_params`).

    # The learner's process: a thread copies the newest parameters to the
    # buffer every `every` updates, off the train loop.
    publisher = Publisher(source, updates, every=1)
    publisher.layout, publisher.path        # for the policy process
    publisher.lags()                        # the policy's lag, in updates
    # The policy process: a thread moves each new generation to the policy
    # devices and installs it between policy calls.
    subscriber = Subscriber(path, layout, shardings, install)
    subscriber.version, subscriber.lag()    # acting version; lag of a call

`source()` returns (version, {name: array}), the newest parameters (device
arrays or numpy) and the update count they are of; `updates()` the
learner's update count now (a cheap read, polled). `install(params,
version)` hands device arrays, already transferred, to the policy.

Device to host to device: the publisher copies each array to the host
(`to_host`: `np.asarray`, or with `pinned` through JAX's pinned host memory
where the device offers it) straight into the buffer's slot; the
subscriber copies the slot to the host, checks that the slot was not
rewritten meanwhile, and transfers the copy to the policy devices
(`to_device`, waiting until the transfer is done); a read the writer
outran is tried again at the next poll. `embodied.perf.param_transfer`
measures both directions.
"""

import threading
import time

import jax
import numpy as np

from embodied.rpc import shared_params

PINNED = 'pinned_host'


def pinned_available(array):
    """Whether the devices of `array` offer pinned host memory to JAX."""
    try:
        return any(m.kind == PINNED
                   for d in array.sharding.device_set
                   for m in d.addressable_memories())
    except (AttributeError, NotImplementedError, jax.errors.JaxRuntimeError):
        return False


def host_array(value, pinned=False):
    """`value` as a numpy array on the host; with `pinned`, a device array
    goes through pinned host memory first (where its device offers it)."""
    if pinned and isinstance(value, jax.Array) and pinned_available(value):
        value = jax.device_put(value, value.sharding.with_memory_kind(PINNED))
    return np.asarray(value)


def to_host(params, into, pinned=False):
    """Copies the arrays of `params` to the host, into the numpy arrays of
    `into` (same names, e.g. a buffer's slot); returns `into`."""
    for key, view in into.items():
        np.copyto(view, host_array(params[key], pinned), casting='no')
    return into


def to_device(arrays, shardings, pinned=False):
    """`arrays` (host, e.g. a buffer's slot) on the devices of `shardings`
    ({name: sharding}, or one sharding for all), finished. With `pinned`,
    through pinned host memory first. On a CPU device the result may share
    the memory of `arrays` (JAX did so once despite may_alias=False): pass
    arrays nobody rewrites, as the subscriber's copy of a read."""
    def put(key, value):
        sharding = shardings[key] if isinstance(shardings, dict) else (
            shardings)
        if pinned:
            host = sharding.with_memory_kind(PINNED)
            value = jax.device_put(value, host, may_alias=False)
        return jax.device_put(value, sharding, may_alias=False)
    result = {k: put(k, v) for k, v in arrays.items()}
    return jax.block_until_ready(result)


class Publisher:
    """The learner's side: a thread that writes the newest parameters to a
    new buffer every `every` updates (and sets the learner's update count
    every `poll` seconds). `close()` ends it and removes the buffer."""

    def __init__(self, source, updates, every=1, pinned=False, poll=0.002,
                 directory=None):
        self.source, self.updates = source, updates
        self.every, self.pinned, self.poll = max(1, int(every)), pinned, poll
        version, params = source()
        self.layout = shared_params.layout_of(params)
        self.writer = shared_params.ParamWriter(self.layout, directory)
        self.path = self.writer.path
        self._write(version, params)
        self.writes = 1
        self.write_seconds = 0.0  # Summed over the writes of the thread.
        self.error = None
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name='PolicyParamsPublisher', daemon=True)
        self._thread.start()

    def _write(self, version, params):
        self.writer.set_updates(self.updates())
        self.writer.write(_HostArrays(params, self.pinned), version)
        self.version = version

    def _run(self):
        try:
            while not self._stop.is_set():
                updates = self.updates()
                self.writer.set_updates(updates)
                if updates - self.version < self.every:
                    self._stop.wait(self.poll)
                    continue
                start = time.monotonic()
                version, params = self.source()
                self._write(version, params)
                self.writes += 1
                self.write_seconds += time.monotonic() - start
        except Exception as e:  # Reported by `check()`.
            self.error = e

    def check(self):
        """Raises the thread's error, if it failed."""
        if self.error is not None:
            raise RuntimeError(
                f'Writing the policy parameters failed: '
                f'{type(self.error).__name__}: {self.error}') from self.error

    def lags(self):
        """The policy's lag since the last call: {'policy_lag/mean',
        'policy_lag/max'} in updates, {} without policy calls."""
        return self.writer.lags()

    def close(self):
        self._stop.set()
        self._thread.join(10)
        self.writer.close()


class _HostArrays:
    """The arrays of `params` as the buffer's `write` copies them: each
    moved to the host when read (`host_array`)."""

    def __init__(self, params, pinned):
        self.params, self.pinned = params, pinned

    def __getitem__(self, key):
        return host_array(self.params[key], self.pinned)


class Subscriber:
    """The policy's side: a thread that waits for each new generation in the
    buffer at `path`, moves it to the devices of `shardings` and calls
    `install(params, version)`. `close()` ends it."""

    def __init__(self, path, layout, shardings, install, pinned=False,
                 poll=0.002):
        self.reader = shared_params.ParamReader(path, layout)
        self.shardings, self.install = shardings, install
        self.pinned, self.poll = pinned, poll
        self.version = None  # The installed parameters' version.
        self.reads = 0
        self.torn = 0  # Reads given up because the writer outran them.
        self.read_seconds = 0.0
        self.error = None
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name='PolicyParamsSubscriber', daemon=True)

    def start(self):
        self._thread.start()
        return self

    def update(self):
        """Installs the newest generation if there is a newer one than the
        installed; returns whether it did."""
        start = time.monotonic()
        # A host copy inside the read, the device transfer after it: a
        # transfer can queue behind the policy's computations on the
        # device, long enough for the writer to rewrite the slot twice.
        try:
            got = self.reader.read()
        except shared_params.TornRead:
            self.torn += 1  # The writer outran this read: the next one.
            return False
        if got is None:
            return False
        _, version, host = got
        params = to_device(host, self.shardings, self.pinned)
        self.install(params, version)
        self.version = version
        self.reads += 1
        self.read_seconds += time.monotonic() - start
        return True

    def wait(self, timeout=None):
        """Waits for the first generation and installs it; returns whether
        one came within `timeout` seconds."""
        if not self.reader.wait(1, timeout):
            return False
        self.update()
        return True

    def _run(self):
        try:
            while not self._stop.wait(self.poll):
                self.update()
        except Exception as e:  # Reported by `check()`.
            self.error = e

    def check(self):
        if self.error is not None:
            raise RuntimeError(
                f'Reading the policy parameters failed: '
                f'{type(self.error).__name__}: {self.error}') from self.error

    def lag(self):
        """How many updates old the installed parameters are now; records
        it for the learner's `policy_lag` metrics."""
        lag = max(0, self.reader.updates - (self.version or 0))
        self.reader.add_lag(lag)
        return lag

    def close(self):
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        self.reader.close()
