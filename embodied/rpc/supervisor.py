"""Starts the workers of a launch together and watches them.

    group = Supervisor()
    group.add(workers.Process(fn, *args, name='Replay'))
    group.start()
    while running:
        group.check()          # raises WorkerFailed naming the worker
    group.wait(timeout=10)     # after asking them to stop
    group.kill()               # whatever is left
"""

import time

EXIT_PORT_TAKEN = 75  # A server's port was taken; the launcher retries.


class WorkerFailed(RuntimeError):

    def __init__(self, name, exitcode):
        if exitcode == EXIT_PORT_TAKEN:
            detail = 'its port was taken by another program'
        elif exitcode is not None and exitcode < 0:
            detail = f'killed by signal {-exitcode}'
        else:
            detail = f'exit code {exitcode}'
        super().__init__(f"Worker '{name}' ended unexpectedly ({detail}).")
        self.name = name
        self.exitcode = exitcode


class Supervisor:

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
            raise WorkerFailed(worker.name, code)

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
