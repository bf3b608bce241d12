"""Env worker processes that are restarted when they crash.

    pool = EnvPool(specs, max_restarts=args.env_restarts, on_crash=notify)
    pool.start()
    while running:
        pool.poll()         # restarts crashed workers after a back-off;
                            # raises WorkerFailed when one must end the run
    pool.stopping()         # from now on workers may exit; none restarts
    pool.wait(timeout)
    pool.kill()

Each `EnvWorkerSpec` says how to make a fresh, unstarted worker process. A
worker that ends with `EXIT_ENV_INIT` (its env failed in the constructor),
`EXIT_BAD_INPUT` (an observation or action outside its space) or
`EXIT_UNREACHABLE` (no actor within run.connect_timeout) or `EXIT_REFUSED`
(the actor refused the worker's secret) ends the run at once:
a restart would fail the same way. Any other end before `stopping()` (an
exception in the env, SIGKILL, a segfault, even exit 0) is a crash: the
worker is started again after a back-off that doubles with each of its
crashes (`backoff`, 2 * `backoff`, ... at most `max_backoff` seconds), at most
`max_restarts` times per worker (`run.env_restarts`); its next crash ends the
run. A restarted worker builds new envs, whose first step starts a new
episode; `on_crash(spec, exitcode, error)` lets the launcher drop the
unfinished episodes of the crashed envs from the statistics.

The error types below are raised inside env workers; their `exitcode` becomes
the worker's exit code (see `rpc.workers`).
"""

import dataclasses
import time
from collections.abc import Callable

from embodied import rpc
from embodied.rpc.supervisor import (
    WorkerGroup,
    EXIT_BAD_INPUT, EXIT_ENV_INIT, EXIT_REFUSED, EXIT_UNREACHABLE)

FATAL = (EXIT_ENV_INIT, EXIT_BAD_INPUT, EXIT_UNREACHABLE, EXIT_REFUSED)
# Exit codes of a worker that gave up on the actor, and why.
NO_ACTOR = {
    EXIT_UNREACHABLE: 'found no actor within run.connect_timeout',
    EXIT_REFUSED: ('was refused by the actor: its run secret or its '
                   'run.auth differs (see above)')}


class EnvInitError(RuntimeError):
    """An env could not be constructed."""

    exitcode = EXIT_ENV_INIT


class ActorUnreachable(ConnectionError):
    """The actor did not accept the env worker within run.connect_timeout."""

    exitcode = EXIT_UNREACHABLE


class ActorRefused(ConnectionError):
    """The actor refused the env worker's secret until run.connect_timeout."""

    exitcode = EXIT_REFUSED


class BadInput(ValueError):
    """An observation or action that does not match its space."""

    exitcode = EXIT_BAD_INPUT


@dataclasses.dataclass
class EnvWorkerSpec:
    """A worker's name, the env ids it steps, and a factory of a fresh,
    unstarted `rpc.Process` that runs it."""

    name: str
    envids: list
    is_eval: bool
    make: Callable


class _Slot:
    """One worker's current process and its crash history."""

    def __init__(self, spec):
        self.spec = spec
        self.process = None
        self.restarts = 0
        self.due = None  # When a crashed worker starts again.


class EnvPool(WorkerGroup):
    """See the module docstring."""

    def __init__(
            self, specs, max_restarts=10, on_crash=None, backoff=0.5,
            max_backoff=30.0):
        self.slots = [_Slot(spec) for spec in specs]
        self.max_restarts = int(max_restarts)
        self.on_crash = on_crash
        self.backoff = backoff
        self.max_backoff = max_backoff
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
        that crashed since the last call. Raises `rpc.WorkerFailed` for a
        worker that must end the run. With `done_ok`, a worker that exits 0
        has finished (its actor told it to stop) rather than crashed."""
        now = time.monotonic()
        for slot in self.slots:
            if slot.due is not None:
                if now >= slot.due and not self._stopping:
                    slot.due = None
                    slot.process = slot.spec.make().start()
                    print(f'Restarted {slot.spec.name} (pid '
                          f'{slot.process.pid}), restart {slot.restarts} of '
                          f'{self.max_restarts} (run.env_restarts).',
                          flush=True)
                continue
            code = slot.process and slot.process.exitcode
            if code is None or self._stopping or (code == 0 and done_ok):
                continue
            self._crashed(slot, code, now)

    def _crashed(self, slot, code, now):
        error = slot.process.error
        name = slot.spec.name
        if code in FATAL:
            raise rpc.WorkerFailed(name, code, error)
        if slot.restarts >= self.max_restarts:
            raise rpc.WorkerFailed(
                name, code, error,
                detail=f'it crashed {slot.restarts + 1} times, more than '
                       f'run.env_restarts ({self.max_restarts}) allows')
        slot.restarts += 1
        self.restarts += 1
        delay = min(self.max_backoff,
                    self.backoff * 2 ** (slot.restarts - 1))
        slot.due = now + delay
        failure = rpc.WorkerFailed(name, code, error)
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
