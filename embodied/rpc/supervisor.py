"""Starts the workers of a launch together and watches them.

    group = Supervisor()
    group.add(workers.Process(fn, *args, name='Replay'))
    group.start()
    while running:
        group.check()          # raises WorkerFailed naming the worker
    group.wait(timeout=10)     # after asking them to stop
    group.kill()               # whatever is left

`RestartingGroup` restarts the workers that crash (the env workers):

    pool = RestartingGroup(specs, max_restarts, on_crash=notify)
    pool.start()
    while running:
        pool.poll()         # restarts crashed workers after a back-off;
                            # raises WorkerFailed when one must end the run
    pool.stopping()         # from now on workers may exit; none restarts

Each spec has a `name` and `make()`, which gives a fresh, unstarted worker.
A worker that ends with one of the `fatal` exit codes ends the run at once:
a restart would fail the same way. Any other end before `stopping()` (an
exception, SIGKILL, a segfault, even exit 0) is a crash: the worker starts
again after a back-off that doubles with each of its crashes (`backoff`,
2 * `backoff`, ... at most `max_backoff` seconds), at most `max_restarts`
times per worker; its next crash ends the run. `on_crash(spec, exitcode,
error)` is told of each crash.
"""

import signal
import time

from .client import Refused

# Exit codes with a meaning for the launcher. An exception with an int
# attribute `exitcode` ends a worker with that code (see `workers`).
EXIT_PORT_TAKEN = 75  # A server's port was taken; the launcher retries.
EXIT_BAD_INPUT = 65   # Bad data crossed a boundary; restarting cannot help.
EXIT_ENV_INIT = 78    # An env failed in its constructor; restarting cannot help.
EXIT_UNREACHABLE = 69  # A server did not come up within run.connect_timeout.
EXIT_REFUSED = 77     # A server refused the run secret until run.connect_timeout.

_MEANINGS = {
    EXIT_PORT_TAKEN: 'its port was taken by another program',
    EXIT_BAD_INPUT: 'bad input',
    EXIT_ENV_INIT: 'its env failed in the constructor',
    EXIT_UNREACHABLE: 'a server it needs was unreachable',
    EXIT_REFUSED: 'a server refused its run secret',
}


def exit_code(error):
    """The exit code for a connect that gave up: `client.Refused` or
    `client.Unreachable`."""
    return EXIT_REFUSED if isinstance(error, Refused) else EXIT_UNREACHABLE


class WorkerFailed(RuntimeError):
    """A worker ended when it should not have. `error` is the summary of the
    exception that ended it, when it ended by one."""

    def __init__(self, name, exitcode, error=None, detail=None):
        if exitcode in _MEANINGS:
            reason = f'{_MEANINGS[exitcode]}, exit code {exitcode}'
        elif exitcode is not None and exitcode < 0:
            try:
                signame = signal.Signals(-exitcode).name
            except ValueError:
                signame = 'signal'
            reason = f'killed by {signame}, exit code {exitcode}'
        else:
            reason = f'exit code {exitcode}'
        message = f"Worker '{name}' ended unexpectedly ({reason})"
        if detail:
            message += f'; {detail}'
        message += f': {error}' if error else '.'
        super().__init__(message)
        self.name = name
        self.exitcode = exitcode
        self.error = error


class WorkerGroup:
    """Waiting for, inspecting and killing a group's `workers`."""

    workers = ()

    def running(self):
        return [w for w in self.workers if w.exitcode is None]

    def wait(self, timeout):
        """Waits until all workers ended or `timeout` passed; returns the
        names of those still running."""
        deadline = time.monotonic() + timeout
        while self.running() and time.monotonic() < deadline:
            time.sleep(0.05)
        return [w.name for w in self.running()]

    def failed(self):
        """(name, exitcode) of the workers that ended with a non-zero code."""
        return [(w.name, w.exitcode) for w in self.workers
                if w.exitcode not in (None, 0)]

    def kill(self):
        for worker in self.workers:
            if worker.exitcode is None:
                worker.kill()


class Supervisor(WorkerGroup):

    def __init__(self):
        self.workers = []

    def add(self, worker):
        self.workers.append(worker)
        return worker

    def start(self):
        """Starts every worker without waiting for any to come up, the
        processes before the threads. A thread that changes this process's
        environment (JAX sets variables as it imports and starts; the
        agent's runtime sets $XLA_FLAGS) while Python starts a process can
        make that process fail to exec: it exits with code 255 before any
        of its code runs, saying nothing."""
        for worker in sorted(self.workers, key=lambda w: w.in_this_process):
            worker.start()

    def check(self, expected=()):
        """Raises `WorkerFailed` for the first worker that has ended, unless
        it ended with 0 and its name is in `expected`."""
        for worker in self.workers:
            code = worker.exitcode
            if code is None:
                continue
            if code == 0 and worker.name in expected:
                continue
            raise WorkerFailed(
                worker.name, code, getattr(worker, 'error', None))


class _Slot:
    """One worker's current process and its crash history."""

    def __init__(self, spec):
        self.spec = spec
        self.process = None
        self.restarts = 0
        self.due = None  # When a crashed worker starts again.


class RestartingGroup(WorkerGroup):
    """Workers restarted when they crash; see the module docstring.
    `setting` names the restart limit in messages."""

    def __init__(
            self, specs, max_restarts=10, on_crash=None, backoff=0.5,
            max_backoff=30.0, fatal=(), setting='the restart limit'):
        self.slots = [_Slot(spec) for spec in specs]
        self.max_restarts = int(max_restarts)
        self.on_crash = on_crash
        self.backoff, self.max_backoff = backoff, max_backoff
        self.fatal, self.setting = tuple(fatal), setting
        self.restarts = 0  # Restarts of all workers so far.
        self._stopping = False

    @property
    def names(self):
        return [slot.spec.name for slot in self.slots]

    @property
    def workers(self):
        """The current processes (a crashed one until it is restarted)."""
        return [slot.process for slot in self.slots if slot.process]

    def start(self):
        for slot in self.slots:
            slot.process = slot.spec.make().start()

    def poll(self, done_ok=False):
        """Restarts the workers whose back-off is over and schedules those
        that crashed since the last call. Raises `WorkerFailed` for a worker
        that must end the run. With `done_ok`, a worker that exits 0 has
        finished (it was told to stop) rather than crashed."""
        now = time.monotonic()
        for slot in self.slots:
            if slot.due is not None:
                if now >= slot.due and not self._stopping:
                    slot.due = None
                    slot.process = slot.spec.make().start()
                    print(f'Restarted {slot.spec.name} (pid '
                          f'{slot.process.pid}), restart {slot.restarts} of '
                          f'{self.max_restarts} ({self.setting}).',
                          flush=True)
                continue
            code = slot.process and slot.process.exitcode
            if code is None or self._stopping or (code == 0 and done_ok):
                continue
            self._crashed(slot, code, now)

    def _crashed(self, slot, code, now):
        error = slot.process.error
        name = slot.spec.name
        if code in self.fatal:
            raise WorkerFailed(name, code, error)
        if slot.restarts >= self.max_restarts:
            raise WorkerFailed(
                name, code, error,
                detail=f'it crashed {slot.restarts + 1} times, more than '
                       f'{self.setting} ({self.max_restarts}) allows')
        slot.restarts += 1
        self.restarts += 1
        delay = min(self.max_backoff,
                    self.backoff * 2 ** (slot.restarts - 1))
        slot.due = now + delay
        failure = WorkerFailed(name, code, error)
        print(f'{failure} Restarting it in {delay:.1f} s.', flush=True)
        if self.on_crash:
            self.on_crash(slot.spec, code, error)

    def stopping(self):
        """From now on workers may exit and none is restarted."""
        self._stopping = True
        for slot in self.slots:
            slot.due = None

    def restarting(self):
        """Whether a crashed worker waits for its restart."""
        return any(slot.due is not None for slot in self.slots)

    def kill(self):
        self.stopping()
        super().kill()
