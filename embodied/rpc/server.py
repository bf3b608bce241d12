"""An RPC server for `portal.Client`s that batches requests in one process.

    server = Server('localhost:7000', 'Actor')
    server.bind('act', policy, postfn=book_keep, batch=8, workers=2)
    server.bind('status', status)
    server.start()                   # serves in a background thread
    ...
    server.close()

It speaks portal's wire format, so any `portal.Client` can call it, and it
differs from `portal.Server` / `portal.BatchServer` where those conflict with
a long-running, fault-tolerant run:

* Batching happens in the server's own loop: no batcher process, no inner
  server and port, no busy polling (the loop blocks until a message, a
  finished job or a flush deadline).
* A batched request is a dict of arrays whose first axis counts rows (one
  request may carry several envs). A request of unbatched leaves, told apart
  by a scalar among them (the original's env process sends one env per
  request, with a scalar `envid`), counts as one row, and its reply comes
  back unbatched too, as `portal.BatchServer` does. A batch fires when the pending requests
  hold at least `batch` rows, or `flush_after` seconds after the oldest
  arrived, so a missing client never stalls the others.
* Requests are checked against the first one accepted (keys, dtype, trailing
  shape; a leaf of the same kind converts when its values survive, e.g.
  int64 to int32); a mismatch is answered with an error naming the key, expected and
  actual, and the others are unaffected. A method bound with `check(data)`
  answers the requests it finds a problem in (the string it returns) the
  same way, e.g. the actor's check for non-finite observations. Undecodable messages and malformed
  frames drop that connection only. Unknown methods get an error reply.
* An exception in a bound function answers its requests with the error and
  is kept in `error`, for the owner to end the run with (`raise_error()`).
* `postfn(info)` runs after the reply, one at a time, in request order; at
  most `max_post` results wait for it, which holds new batches back.
* A finished job is answered from its worker thread, which also starts the
  next batch that waits for a worker: the loop thread is woken only when a
  partial batch then waits for its flush deadline. State shared by the loop
  and the workers (queues, counts of running jobs) is guarded by one lock.
* With `auth` (`auth.Credentials`), only peers that open with the run's
  token are served, and the methods named in `control` (or bound with
  `control=True`) only for peers that opened with the launcher's control
  token; `max_frame` bounds the size of
  a request (see `sockets`).
* `pause(name)` holds new work for a method, `answer(name, value)` replies
  `value` to every pending and future request without calling the method
  (used to tell clients to stop), and `idle(name)` says whether no job of
  that method is running or waiting for its postfn.
"""

import collections
import threading
import time
import traceback

import numpy as np

from embodied.core import diskfull
from embodied.core import outofmemory
from embodied.core import savetree

from . import daemon_pool
from . import sockets
from . import status
from . import wire

_OK = status.header(status.OK)  # Made once: every reply sends it.


class _Request:

    __slots__ = ('addr', 'reqnum', 'args', 'rows', 'time', 'single')

    def __init__(self, addr, reqnum, args, rows, now, single=False):
        self.addr = addr
        self.reqnum = reqnum
        self.args = args
        self.rows = rows
        self.time = now
        self.single = single  # Unbatched leaves, sent as one row.


class _Method:

    def __init__(self, name, workfn, postfn, batch, workers, max_post):
        self.name = name
        self.workfn = workfn
        self.postfn = postfn
        self.batch = batch
        self.workers = workers
        self.max_post = max_post
        # Daemon threads: a job waiting on a peer that died holds no exit.
        self.pool = daemon_pool.DaemonPool(workers, f'{name}_work')
        self.postpool = postfn and daemon_pool.DaemonPool(1, f'{name}_post')
        self.queue = collections.deque()
        self.rows = 0
        self.spec = None
        self.running = 0
        self.ordered = collections.deque()  # Jobs awaiting their postfn.
        self.posting = collections.deque()  # Submitted postfn futures.
        self.paused = False
        self.fixed = None  # Reply given instead of calling the method.
        self.check = None  # check(data) -> problem or None.
        self.stats = collections.Counter()


class Server:
    """See the module docstring. `addr` may have port 0; see `port`."""

    def __init__(
            self, addr, name='Server', flush_after=0.02, ipv6=False,
            logging=False, auth=None, control=(), max_frame=None):
        self.name = name
        self.flush_after = flush_after
        self.authenticated = auth is not None
        self.control = set(control) if self.authenticated else set()
        self.socket = sockets.ServerSocket(
            addr, name, ipv6=ipv6, logging=logging, auth=auth,
            max_frame=max_frame)
        self.methods = {}
        self.error = None
        self.running = False
        self.thread = None
        self._lock = threading.RLock()  # Method state; see _finished.
        self._started = time.monotonic()

    @property
    def port(self):
        return self.socket.port

    @property
    def connections(self):
        return self.socket.connections

    def bind(self, name, workfn, postfn=None, batch=0, workers=1, max_post=None,
             check=None, control=False):
        """Serves `name`. With `postfn`, `workfn` returns `(reply, info)`.
        With `check` (batched methods), a request for which `check(data)`
        returns a message is answered with that message as a bad request.
        With `control` (and `auth`), only peers with the control token may
        call it, as if it were named in the constructor's `control`."""
        assert not self.running, 'bind before start'
        if control and self.authenticated:
            self.control.add(name)
        assert name not in self.methods, name
        assert workers >= 1 and batch >= 0, (workers, batch)
        max_post = max_post or 2 * workers
        self.methods[name] = _Method(
            name, workfn, postfn, batch, workers, max_post)
        self.methods[name].check = check

    def start(self):
        assert not self.running
        self.running = True
        self.thread = threading.Thread(
            target=self._loop, name=f'{self.name}Loop', daemon=True)
        self.thread.start()
        return self

    def close(self, timeout=5):
        """Stops serving. Jobs still running get up to `timeout` seconds to
        finish, so their replies are sent (a `shutdown` method that makes
        its owner close the server still answers)."""
        deadline = time.monotonic() + timeout
        while self.running and time.monotonic() < deadline and any(
                method.running for method in self.methods.values()):
            time.sleep(0.01)
        if self.running:
            self.running = False
            self.socket.wake(None)
            self.thread.join(timeout)
        for method in self.methods.values():
            method.pool.shutdown(wait=False, cancel_futures=True)
            method.postpool and method.postpool.shutdown(wait=False)
        self.socket.close(timeout)

    def raise_error(self):
        """Re-raises the first error of a bound function, if any."""
        if self.error:
            raise self.error

    def pause(self, name):
        self.methods[name].paused = True

    def resume(self, name):
        self.methods[name].paused = False
        self.socket.wake(None)

    def answer(self, name, value):
        """Replies `value` to all pending and future `name` requests."""
        self.methods[name].fixed = value
        self.socket.wake(None)

    def idle(self, name):
        """Whether no `name` job is running or waiting for its postfn
        (requests that wait in the queue have not started)."""
        method = self.methods[name]
        return not (method.running or method.ordered or method.posting)

    def stats(self):
        """Counters per method since the last call, plus dropped peers."""
        result = {'dropped': self.socket.dropped,
                  'refused': self.socket.refused}
        for method in self.methods.values():
            counts, method.stats = method.stats, collections.Counter()
            for key, value in counts.items():
                result[f'{method.name}/{key}'] = value
        return result

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    # Everything below runs in the loop thread or, for finished jobs and
    # postfns, in their worker threads, under `_lock`.

    def _loop(self):
        try:
            while self.running:
                with self._lock:
                    timeout = self._timeout()
                item = self._receive(timeout)
                while item is not None:
                    with self._lock:
                        self._handle(item)
                    item = self._receive(0)
                with self._lock:
                    for method in self.methods.values():
                        self._dispatch(method)
        except Exception as e:
            self.error = self.error or e
            traceback.print_exc()
            self.running = False

    def _receive(self, timeout):
        try:
            return self.socket.recv(timeout)
        except TimeoutError:
            return None

    def _timeout(self):
        deadline = None
        now = time.monotonic()
        for method in self.methods.values():
            if method.batch and method.queue and self._can_start(method):
                due = method.queue[0].time + self.flush_after
                deadline = due if deadline is None else min(deadline, due)
        if deadline is None:
            return 0.5
        return max(0.0, deadline - now)

    def _handle(self, item):
        if item is None:  # Woken to re-check pauses and answers.
            return
        addr, data = item
        try:
            reqnum = bytes(data[:8])
            strlen = int.from_bytes(data[8:16], 'little')
            name = bytes(data[16:16 + strlen]).decode('utf-8')
            args = wire.unpack(data[16 + strlen:])
            assert isinstance(args, list), type(args)
        except Exception:
            self._log(f'Dropping {addr}: undecodable message.')
            self.socket.drop(addr)
            return
        method = self.methods.get(name)
        if method is None:
            known = ', '.join(self.methods)
            return self._send_error(
                addr, reqnum, status.UNKNOWN_METHOD,
                f"Unknown method '{name}' (known: {known}).")
        if name in self.control and addr not in self.socket.control:
            method.stats['refused'] += 1
            return self._send_error(
                addr, reqnum, status.BAD_INPUT,
                f'{self.name}.{name}: only the launcher of the run may call '
                f'this method.')
        method.stats['requests'] += 1
        if method.fixed is not None:
            return self._send(addr, reqnum, method.fixed)
        rows, single = 0, False
        if method.batch:
            args, single = _as_rows(args)
            problem, rows = self._check(method, args)
            if not problem and method.check:
                problem = method.check(args[0])
                problem = problem and f'{self.name}.{name}: {problem}'
            if problem:
                method.stats['rejected'] += 1
                return self._send_error(
                    addr, reqnum, status.BAD_INPUT, problem)
        method.queue.append(
            _Request(addr, reqnum, args, rows, time.monotonic(), single))
        method.rows += rows

    def _check(self, method, args):
        """Returns (problem or None, rows) for a batched request."""
        prefix = f"{self.name}.{method.name}"
        if len(args) != 1 or not isinstance(args[0], dict) or not args[0]:
            return f'{prefix}: expected one dict of arrays.', 0
        data = args[0]
        spec = {}
        rows = None
        for key, value in data.items():
            if not isinstance(value, np.ndarray) or value.ndim < 1:
                return (f"{prefix}: '{key}' must be an array with a first "
                        f"axis of rows, got {type(value).__name__} "
                        f"{getattr(value, 'shape', '')}."), 0
            if rows is None:
                rows = len(value)
            if len(value) != rows or rows < 1:
                return (f"{prefix}: '{key}' has {len(value)} rows, expected "
                        f"{rows} like the other keys."), 0
            spec[key] = (value.dtype, value.shape[1:])
        if method.spec is None:
            method.spec = spec
            return None, rows
        if spec.keys() != method.spec.keys():
            missing = sorted(method.spec.keys() - spec.keys())
            extra = sorted(spec.keys() - method.spec.keys())
            return (f'{prefix}: keys differ from earlier requests '
                    f'(missing {missing}, unexpected {extra}).'), 0
        for key, (dtype, shape) in spec.items():
            if (dtype, shape) == method.spec[key]:
                continue
            want_dtype, want_shape = method.spec[key]
            converted = _converted(data[key], want_dtype)
            if shape == want_shape and converted is not None:
                # The original's env sends Python ints (int64) where ours
                # send int32: one kind, so the values convert exactly.
                data[key] = converted
                continue
            return (f"{prefix}: '{key}' expected dtype {want_dtype} "
                    f"shape {want_shape} per row, got dtype {dtype} "
                    f"shape {shape}."), 0
        return None, rows

    def _dispatch(self, method):
        if method.fixed is not None:
            while method.queue:
                request = method.queue.popleft()
                self._send(request.addr, request.reqnum, method.fixed)
            method.rows = 0
            return
        while method.queue and self._can_start(method):
            if method.batch:
                requests = self._take_batch(method)
                if not requests:
                    return
            else:
                requests = [method.queue.popleft()]
            method.running += 1
            job = method.pool.submit(self._work, method, requests)
            if method.postfn:
                method.ordered.append(job)
            job.add_done_callback(
                lambda job, m=method, r=requests: self._finished(m, r, job))

    def _finished(self, method, requests, job):
        # Runs in the worker thread that ran the job (or here, if it was
        # done before the callback was added; the lock is reentrant).
        if job.cancelled() or not self.running:
            return
        with self._lock:
            self._finish(method, requests, job)
            self._dispatch(method)
            if method.queue and self._can_start(method):
                # A partial batch waits for its flush deadline, which the
                # loop computed without this worker: let it compute again.
                self.socket.wake(None)

    def _can_start(self, method):
        backlog = len(method.ordered) + len(method.posting)
        return (not method.paused and method.running < method.workers and
                backlog < method.max_post)

    def _take_batch(self, method):
        full = method.rows >= method.batch
        due = time.monotonic() >= method.queue[0].time + self.flush_after
        if not (full or due):
            return None
        requests, rows = [], 0
        while method.queue and rows < method.batch:
            request = method.queue.popleft()
            requests.append(request)
            rows += request.rows
        method.rows -= rows
        method.stats['batches'] += 1
        method.stats['rows'] += rows
        method.stats['partial'] += int(rows < method.batch)
        method.stats['wait_seconds'] += time.monotonic() - requests[0].time
        return requests

    def _work(self, method, requests):
        start = time.monotonic()
        if method.batch:
            if len(requests) == 1:
                data = requests[0].args[0]
            else:
                data = {key: np.concatenate([r.args[0][key] for r in requests])
                        for key in requests[0].args[0]}
            result = method.workfn(data)
        else:
            result = method.workfn(*requests[0].args)
        method.stats['busy_seconds'] += time.monotonic() - start
        return result

    def _finish(self, method, requests, job):
        method.running -= 1
        try:
            result = job.result()
        except Exception as e:
            self._failed(method, e)
            for request in requests:
                self._send_error(
                    request.addr, request.reqnum, status.FAILED,
                    f'{self.name}.{method.name} failed: '
                    f'{type(e).__name__}: {e}')
            if method.postfn:
                method.ordered.remove(job)
            return
        reply = result[0] if method.postfn else result
        if method.batch:
            start = 0
            for request in requests:
                stop = start + request.rows
                if request.single:
                    part = {k: v[start] for k, v in reply.items()}
                else:
                    part = {k: v[start:stop] for k, v in reply.items()}
                self._send(request.addr, request.reqnum, part)
                start = stop
        else:
            self._send(requests[0].addr, requests[0].reqnum, reply)
        self._post(method)

    def _post(self, method):
        while method.ordered and method.ordered[0].done():
            job = method.ordered.popleft()
            if job.exception():
                continue
            future = method.postpool.submit(method.postfn, job.result()[1])
            method.posting.append(future)
            future.add_done_callback(
                lambda f, m=method: self._posted(m, f))

    def _posted(self, method, future):
        if future.cancelled() or not self.running:
            return
        with self._lock:
            method.posting.remove(future)
            if future.exception():
                self._failed(method, future.exception(), 'postfn')
            # A full backlog held batches back: start them.
            self._dispatch(method)
            if method.queue and self._can_start(method):
                self.socket.wake(None)

    def _failed(self, method, error, what='method'):
        self.error = self.error or error
        if diskfull.find(error) or outofmemory.find(error) or (
                savetree.find(error)):
            return  # The caller ends the run with one line saying why.
        text = ''.join(traceback.format_exception(error))
        self._log(f'Error in {what} {method.name}:\n{text}')

    def _send(self, addr, reqnum, data):
        try:
            self.socket.send(addr, reqnum, _OK, *wire.pack(data))
        except Exception as e:  # The client may be gone; others continue.
            self._log(f'Could not reply to {addr}: {type(e).__name__}: {e}')

    def _send_error(self, addr, reqnum, code, message):
        try:
            self.socket.send(addr, reqnum, status.header(code),
                             message.encode('utf-8'))
        except Exception:
            pass

    def _log(self, message):
        print(f'[{self.name}] {message}', flush=True)


def _as_rows(args):
    """`(args, single)`: a request of unbatched leaves (a scalar among
    them) as one row with a leading axis of 1 on every leaf."""
    if len(args) != 1 or not isinstance(args[0], dict):
        return args, False
    data = args[0]
    if not any(isinstance(v, np.ndarray) and v.ndim == 0
               for v in data.values()):
        return args, False
    if not all(isinstance(v, np.ndarray) for v in data.values()):
        return args, False  # `_check` names the key that is no array.
    return [{k: v[None] for k, v in data.items()}], True


def _converted(value, dtype):
    """`value` as `dtype` when both are of one kind (integer, float, ...)
    and the values survive the conversion, else None."""
    if value.dtype.kind != dtype.kind:
        return None
    converted = value.astype(dtype)
    return converted if np.array_equal(converted, value) else None
