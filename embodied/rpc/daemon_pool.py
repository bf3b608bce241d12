"""A thread pool whose threads never hold the interpreter's exit.

`concurrent.futures.ThreadPoolExecutor` joins its threads when the
interpreter exits, without a timeout: one job that waits forever (a reply
from a peer that died, a connection that never comes back) keeps the
process alive after its main thread ended, its workers gone. A server's
jobs here can wait on peers, so its pools are `DaemonPool`s: the same
`submit` and `shutdown`, daemon threads, and nothing registered at exit.
What a job must finish before the process exits, its owner waits for.

    pool = DaemonPool(2, 'act_work')
    future = pool.submit(fn, *args)   # a concurrent.futures.Future
    pool.shutdown(wait=False, cancel_futures=True)
"""

import concurrent.futures
import queue
import threading


class DaemonPool(concurrent.futures.Executor):
    """At most `workers` daemon threads named `<name>_<i>`, started as jobs
    arrive; see the module docstring."""

    def __init__(self, workers, name='pool'):
        assert workers >= 1, workers
        self.workers = int(workers)
        self.name = name
        self._jobs = queue.SimpleQueue()
        self._threads = []
        self._idle = 0
        self._lock = threading.Lock()
        self._shutdown = False

    def submit(self, fn, /, *args, **kwargs):
        future = concurrent.futures.Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError(
                    f'The pool {self.name} is shut down: no new jobs.')
            self._jobs.put((future, fn, args, kwargs))
            if self._idle:
                self._idle -= 1  # That thread takes this job.
            elif len(self._threads) < self.workers:
                thread = threading.Thread(
                    target=self._run, daemon=True,
                    name=f'{self.name}_{len(self._threads)}')
                self._threads.append(thread)
                thread.start()
        return future

    def shutdown(self, wait=True, *, cancel_futures=False):
        """No new jobs; with `cancel_futures`, the jobs not started are
        cancelled; with `wait`, waits for the threads to finish the rest."""
        with self._lock:
            self._shutdown = True
            if cancel_futures:
                while True:
                    try:
                        job = self._jobs.get_nowait()
                    except queue.Empty:
                        break
                    if job is not None:
                        job[0].cancel()
            for _ in self._threads:
                self._jobs.put(None)
            threads = list(self._threads)
        if wait:
            for thread in threads:
                thread.join()

    def _run(self):
        while True:
            job = self._jobs.get()
            if job is None:
                return
            future, fn, args, kwargs = job
            del job
            if not future.set_running_or_notify_cancel():
                self._done()
                continue
            try:
                result = fn(*args, **kwargs)
            except BaseException as e:
                self._done()  # Before the caller hears: its next job
                future.set_exception(e)  # finds this thread idle.
                del e
            else:
                self._done()
                future.set_result(result)
                del result
            del future, fn, args, kwargs

    def _done(self):
        with self._lock:
            self._idle += 1
