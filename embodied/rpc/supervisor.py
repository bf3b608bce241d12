"""Starts the workers of a launch together and watches them.

    group = Supervisor()
    group.add(workers.Process(fn, *args, name='Replay'))
    group.start()
    while running:
        group.check()          # raises WorkerFailed naming the worker
    group.wait(timeout=10)     # after asking them to stop
    group.kill()               # whatever is left
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
        """Starts every worker without waiting for any to come up."""
        for worker in self.workers:
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
