"""The clients: portal's on an event-driven socket loop, and one without a
thread for one call at a time.

portal 3.8.3's `ClientSocket` loop passes 0.2 to `select.poll().poll()`,
whose timeout is in milliseconds, so every idle client wakes 5,000 times a
second; and after a burst of sends a leftover wake-up byte can leave it
looping without polling at all until the next send. On a few cores that costs
more than the work. `ClientSocket` here runs the same protocol with a loop
that sleeps in `poll` until the socket or a send needs it (200 ms at most),
and `Client` is `portal.Client` on top of it. Connecting waits for the
server's verdict on a token handshake (`auth`): a refused client keeps
`refusal` (the line it printed), and every reconnect waits through a
`backoff.Backoff` (0.1 s doubling to 5 s, one line per reason per
`report_every` seconds). Everything else (futures, resends, the wire
format) is portal's.

`SyncClient` speaks the same protocol from the calling thread, for an env
worker's request and wait, over and over: portal's background thread would
cost two thread hand-offs per call. A lost connection raises
`portal.Disconnected`; reconnecting is the caller's choice.
"""

import collections
import functools
import itertools
import os
import select
import threading
import time

import socket

import portal
from portal import buffers
from portal import utils as portal_utils
from portal import client_socket
from portal import contextlib as portal_contextlib
from portal import futures as portal_futures

from . import addresses
from . import auth
from . import backoff as backofflib
from . import status
from . import wire

_POLL_MS = 200
_HANDSHAKE = b'portal_handshake'
_KEEPALIVE = (10, 10, 10)  # After, every, fails: portal's defaults.
_READ = select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP


class Unreachable(ConnectionError):
    """A server did not accept a connection within the allowed time."""


class Refused(Unreachable):
    """A server refused the handshake: this command's run secret, or its
    run.auth (`auth_differs`), differs from the run's. Its message says
    which server and what to set."""

    def __init__(self, *args, auth_differs=False):
        super().__init__(*args)
        self.auth_differs = auth_differs


class BadRequest(RuntimeError):
    """The server rejected the request's input (see `Server`'s checks)."""


class RemoteError(RuntimeError):
    """The server's method raised while handling the request."""


# The errors of `server.Server`'s codes (portal raises RuntimeError for all).
_ERRORS = {status.FAILED: RemoteError, status.BAD_INPUT: BadRequest}


class Refusals:
    """What a client knows of a server's refusals, each reported through
    its `backoff` (one line per reason per `backoff.every` seconds)."""

    def __init__(self, name, backoff):
        self.name, self.backoff = name, backoff
        self.message = None  # The line of the last refusal, while refused.
        self.auth_differs = False  # Whether it was refused for run.auth.
        self.no_verdicts = 0  # In a row (see `auth.NO_VERDICTS`).

    def attempt(self, connect, addr):
        """Calls `connect()` (a connected socket, or it raises as
        `_handshake`) once: the socket, or None and the longest wait before
        the next attempt (None after a refusal: the full back-off)."""
        try:
            sock = connect()
        except auth.NoVerdict:
            self.no_verdicts += 1
            if self.no_verdicts < auth.NO_VERDICTS:
                return None, backofflib.NO_SERVER_WAIT
            self.report('', addr, own_auth=True)
            return None, None
        except Refused as e:
            self.no_verdicts = 0
            self.report(str(e), addr)
            return None, None
        except OSError:  # No server took the connection.
            self.no_verdicts = 0
            return None, backofflib.NO_SERVER_WAIT
        self.no_verdicts, self.message = 0, None
        return sock, None

    def report(self, server, addr, own_auth=None):
        """Reports a refusal: of the secret, or with `own_auth` (this
        command's run.auth) of a run.auth that differs."""
        self.auth_differs = own_auth is not None
        if self.auth_differs:
            self.message = auth.auth_mismatch(self.name, server, addr, own_auth)
        else:
            self.message = auth.refusal_message(self.name, server, addr)
        self.backoff.report('refused', self.message, auth.still_refused(
            self.name, server, addr))


def connect_loop(attempts, refusals, pause):
    """The connect loop of both clients: tries each `(addr, connect)` of
    `attempts` through `refusals.attempt` until one gives a socket, which
    it returns (None once `attempts` ends); `pause(cap)` waits between
    attempts, at most `cap` seconds where no server answered (None: no
    limit but the back-off's), and may raise to give up."""
    for addr, connect in attempts:
        sock, cap = refusals.attempt(connect, addr)
        if sock is not None:
            return sock
        pause(cap)
    return None


class ClientSocket(client_socket.ClientSocket):

    def __init__(self, addr, name='Client', start=True, report_every=30,
                 **kwargs):
        self.backoff = backofflib.Backoff(every=report_every)
        self.refusals = Refusals(name, self.backoff)
        # Runs every 0.2 s while a call waits for a lost connection; may
        # raise to give up (`connect(check=...)` sets it).
        self.check = None
        super().__init__(addr, name, start, **kwargs)

    def _connect(self):
        # portal's connect loop, plus the verdict on a token handshake and
        # a growing wait between attempts instead of a fixed one.
        return connect_loop(
            self._attempts(), self.refusals,
            lambda cap: self._sleep(self.backoff.next_delay(cap)))

    def _attempts(self):
        """The `(addr, connect)` of each attempt, while the client runs."""
        handshake = self.options.handshake
        verdict = auth.expects_verdict(handshake)
        while self.running:
            host, port = self.addr
            if portal_contextlib.context.resolver:
                host, port = portal_contextlib.context.resolver((host, port))
            port = int(port)
            target = (host, port, 0, 0) if self.options.ipv6 else (host, port)
            yield f'{host}:{port}', functools.partial(
                self._open, target, handshake.encode('utf-8'), verdict)

    def _open(self, target, handshake, verdict):
        """A socket connected to `target` that made the handshake;
        raises as `_handshake`."""
        sock = self._create()
        try:
            _handshake(sock, target, handshake, verdict)
        except BaseException:
            sock.close()
            raise
        sock.settimeout(0)
        return sock

    def _sleep(self, seconds):
        deadline = time.monotonic() + seconds
        while self.running and time.monotonic() < deadline:
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))

    def require_connection(self, timeout):
        # portal waits for a connection without end; this wait also ends
        # when the client is closed, so a call blocked on a dead server does
        # not keep its thread, and with it the process, alive, and when
        # `check` raises (the launcher's: the role's worker has died).
        if self.connected:
            return
        if not self.options.autoconn:
            raise portal.Disconnected
        if timeout == 0:
            raise TimeoutError
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.isconn.wait(0.2):
            if not self.running:
                raise portal.Disconnected
            if self.check:
                self.check()
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError

    def _loop(self):
        maxsize = self.options.max_msg_size
        recvbuf = buffers.RecvBuffer(maxsize=maxsize)
        sock = None
        poll = select.poll()
        poll.register(self.get_signal, select.POLLIN)
        isconn = False

        while self.running or (self.sendq and isconn):
            if not isconn:
                if not self.options.autoconn and not self.wantconn.wait(0.2):
                    continue
                sock = self._attach(poll)
                if not sock:
                    break
                isconn = True
            try:
                mask = select.POLLIN | (select.POLLOUT if self.sendq else 0)
                poll.modify(sock, mask)
                ready = dict(poll.poll(_POLL_MS))
                if self.get_signal in ready:
                    os.read(self.get_signal, 4096)  # All wake-ups at once.
                if ready.get(sock.fileno(), 0) & _READ:
                    recvbuf = self._receive(sock, recvbuf)
                if self.sendq:
                    self._send_next(sock)
            except OSError as e:
                self._detach(poll, sock, e)
                isconn = False
                recvbuf = buffers.RecvBuffer(maxsize=maxsize)
        if sock:
            sock.close()

    def _attach(self, poll):
        """Connects (`_connect`) and polls the new socket; None once the
        client stopped first."""
        sock = self._connect()
        if not sock:
            return None
        poll.register(sock, select.POLLIN)
        self.isconn.set()
        if not self.options.autoconn:
            self.wantconn.clear()
        [x() for x in self.callbacks_conn]
        return sock

    def _receive(self, sock, recvbuf):
        """Reads what `sock` has into `recvbuf` and hands on a message once
        it is whole; returns the buffer for what comes next."""
        try:
            recvbuf.recv(sock)
            if not recvbuf.done():
                return recvbuf
            if self.recvq.qsize() > self.options.max_recv_queue:
                raise RuntimeError('Too many incoming messages enqueued')
            msg = recvbuf.result()
            if self._refused_by(msg):
                raise ConnectionRefusedError('refused')
            if self.backoff.attempts:
                # A reply: a server that accepts and then drops each
                # connection keeps its back-off.
                self.backoff.reset()
            self.recvq.put(msg)
            [x(msg) for x in self.callbacks_recv]
            return buffers.RecvBuffer(self.options.max_msg_size)
        except BlockingIOError:
            return recvbuf

    def _send_next(self, sock):
        """Sends what the socket takes of the first queued message."""
        try:
            self.sendq[0].send(sock)
            if self.sendq[0].done():
                self.sendq.popleft()
        except BlockingIOError:
            pass
        except ConnectionResetError:
            pass  # Read what is left until recv fails.

    def _detach(self, poll, sock, error):
        """After a lost connection: reports it, closes the socket and drops
        what was queued."""
        detail = f'{type(error).__name__}: {error}' if str(error) else type(
            error).__name__
        self._log(f'Connection to server lost ({detail})')
        self.isconn.clear()
        poll.unregister(sock)
        sock.close()
        self.sendq.clear()  # As portal: resends happen above this.
        [x() for x in self.callbacks_disc]

    def _refused_by(self, msg):
        """Whether `msg` is a refusal (to a plain handshake of ours that
        met a server with `auth`); records and reports it."""
        verdict = auth.parse_verdict(msg)
        if verdict is None or verdict[0]:
            return False
        self.refusals.report(
            verdict[1], f'{self.addr[0]}:{self.addr[1]}', own_auth=False)
        self._sleep(self.backoff.next_delay())
        return True


class Client(portal.Client):
    """`portal.Client` on the event-driven `ClientSocket`."""

    def __init__(self, addr, name='Client', maxinflight=16, **kwargs):
        # The attributes portal.Client.__init__ sets, in its order, with our
        # socket class; the socket's callbacks use them.
        assert 1 <= maxinflight, maxinflight
        self.maxinflight = maxinflight
        self.reqnum = iter(itertools.count(0))
        self.futures = {}
        self.errors = collections.deque()
        self.sendrate = [0, time.time()]
        self.recvrate = [0, time.time()]
        self.waitmean = [0, 0]
        self.cond = threading.Condition()
        self.lock = threading.Lock()
        self.socket = ClientSocket(addr, name, start=False, **kwargs)
        self.socket.callbacks_recv.append(self._recv)
        self.socket.callbacks_disc.append(self._disc)
        self.socket.callbacks_conn.append(self._conn)
        self.socket.start()

    def call(self, method, *data):
        # portal's `call`, encoding with `wire` (same bytes, less CPU).
        reqnum = next(self.reqnum).to_bytes(8, 'little', signed=False)
        start = time.time()
        while len(self.futures) >= self.maxinflight:
            with self.cond:
                self.cond.wait(timeout=0.2)
            try:
                self.socket.require_connection(timeout=0)
            except TimeoutError:
                pass
        with self.lock:
            self.waitmean[1] += time.time() - start
            self.waitmean[0] += 1
            self.sendrate[0] += 1
        if self.errors:  # Errors of futures that were dropped.
            raise self.errors.popleft()
        name = method.encode('utf-8')
        strlen = len(name).to_bytes(8, 'little', signed=False)
        sendargs = (reqnum, strlen, name, *wire.pack(data))
        future = portal_futures.Future()
        future.sendargs = sendargs
        # Stored before sending: the reply may arrive first.
        self.futures[reqnum] = future
        try:
            self.socket.send(*sendargs)
        except portal.Disconnected:
            self.futures.pop(reqnum, None)
            raise
        return future

    def _recv(self, data):
        code = status.read(data) if len(data) >= 16 else status.OK
        error = _ERRORS.get(code)
        if code == status.OK and len(data) >= 16:
            future = self.futures.pop(bytes(data[:8]), None)
            if future:
                future.set_result(wire.unpack(data[16:]))
                with self.cond:
                    self.cond.notify_all()
        elif error is None:
            return super()._recv(data)
        else:
            future = self.futures.pop(bytes(data[:8]), None)
            if future:
                self._seterr(future, error(bytes(data[16:]).decode('utf-8')))
                with self.cond:
                    self.cond.notify_all()
        try:
            self.socket.recv()
        except AssertionError:
            pass  # Socket is already closed.


def wait_limit(timeout):
    """How long a connect waits, for its progress reports."""
    if timeout is None:
        return 'no time limit: a role of this launch'
    return f'giving up after {timeout} s, run.connect_timeout'


def waiting_line(name, addr, waited, timeout):
    """The line of a client still waiting for its server."""
    return (f'{name}: waiting for the server at {addr}, waited '
            f'{waited:.0f} s so far ({wait_limit(timeout)}).')


def connect(addr, name, timeout=None, ipv6=None, report_every=None,
            check=None, report=None, **kwargs):
    """A connected `Client` for `addr`, or `Unreachable` after `timeout`
    seconds (None waits forever). Every `report_every` seconds of waiting it
    prints whom it waits for (`report`, a line or a callable giving one,
    instead of the plain line); `check()`, if given, runs every 0.2 s of
    waiting and may raise to give up, here and later whenever a call waits
    for the connection to come back. Extra kwargs go to the client
    (`maxinflight`, `autoconn`, `handshake`: the run's, see `auth`; None:
    portal's). `ipv6` defaults to `portal.setup()`'s."""
    if ipv6 is None:
        ipv6 = portal.context.clientkw.get('ipv6', False)
    addr = addresses.client_addr(addr, ipv6)
    kwargs.setdefault('logging', False)
    if kwargs.get('handshake', '') is None:
        del kwargs['handshake']
    if report_every:
        kwargs.setdefault('report_every', report_every)
    client = Client(addr, name, **kwargs)
    start = time.monotonic()
    deadline = None if timeout is None else start + timeout
    next_report = report_every and start + report_every
    while True:
        now = time.monotonic()
        waits = [t - now for t in (next_report, deadline) if t is not None]
        waits += [0.2] if check else []
        if client.connect(max(0.0, min(waits)) if waits else None):
            client.socket.check = check
            return client
        now = time.monotonic()
        try:
            if deadline is not None and now >= deadline:
                raise _gave_up(name, timeout, addr, client.socket.refusals)
            check and check()
        except BaseException:
            client.close(1)
            raise
        if next_report and now >= next_report:
            next_report = now + report_every
            if not client.socket.refusals.message:  # Reported by the socket.
                text = report() if callable(report) else report
                print(text or waiting_line(name, addr, now - start, timeout),
                      flush=True)


def _gave_up(name, timeout, addr, refusals):
    """The error of a client that found no server, or was refused (for its
    secret or its run.auth, see `refusals`), until run.connect_timeout."""
    if not refusals.message:
        return Unreachable(f'{name}: no server at {addr} after {timeout} s '
                           f'(run.connect_timeout).')
    differs = refusals.auth_differs
    what = 'its run.auth differs' if differs else 'its run secret differs'
    return Refused(f'{name}: gave up after {timeout} s (run.connect_timeout): '
                   f'the server at {addr} kept refusing this command: {what} '
                   f'(see above).', auth_differs=differs)


def result(future, stop=None, timeout=None, poll=0.1, report_every=None,
           report=None):
    """Waits for a future; returns None when the `stop` event is set first
    and raises TimeoutError after `timeout` seconds. Every `report_every`
    seconds of waiting it prints `report` (a string or a callable giving
    one) with the time waited so far."""
    start = time.monotonic()
    deadline = None if timeout is None else start + timeout
    next_report = report_every and start + report_every
    while True:
        if future.wait(poll):
            return future.result()
        if stop is not None and stop.is_set():
            return None
        now = time.monotonic()
        if deadline is not None and now > deadline:
            raise TimeoutError('No reply in time.')
        if next_report and now >= next_report:
            next_report = now + report_every
            text = report() if callable(report) else report
            print(f'{text} (waited {now - start:.0f} s).', flush=True)



class SyncClient:
    """A client without a thread: one request at a time, from the caller.

        client = SyncClient.connect('localhost:7000', 'Env00000', timeout=120)
        reply = client.call('act', obs, report_every=30, report='Waiting ...')
    """

    def __init__(self, sock, addr, name):
        self.sock = sock
        self.addr = addr
        self.name = name
        self.reqnum = 0

    @classmethod
    def connect(cls, addr, name, timeout=None, ipv6=False, report_every=None,
                handshake=None, backoff=None):
        """A connected client, or `Unreachable` after `timeout` seconds
        (None: wait forever), reporting every `report_every` seconds;
        `Refused` when the server's last answer was a refusal. `handshake`
        is the run's (see `auth`); portal's plain one if None. Attempts
        wait through `backoff` (a new `backoff.Backoff` if None)."""
        handshake = handshake or _HANDSHAKE.decode()
        verdict = auth.expects_verdict(handshake)
        addr = addresses.client_addr(addr, ipv6)
        host, port = addresses.split(addr)
        backoff = backoff or backofflib.Backoff(every=report_every or 30)
        refusals = Refusals(name, backoff)
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        next_report = report_every and start + report_every

        def pause(cap):
            nonlocal next_report
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise _gave_up(name, timeout, addr, refusals)
            if next_report and now >= next_report and not refusals.message:
                next_report = now + report_every
                print(waiting_line(name, addr, now - start, timeout),
                      flush=True)
            backoff.wait(deadline=deadline, cap=cap)

        connect = functools.partial(
            _open, host, int(port), ipv6, handshake.encode('utf-8'), verdict)
        sock = connect_loop(itertools.repeat((addr, connect)), refusals, pause)
        return cls(sock, addr, name)

    def call(self, method, *args, report_every=None, report=None):
        """Sends a request and returns the reply; every `report_every`
        seconds of waiting prints `report`."""
        if self.sock is None:
            raise portal.Disconnected
        self.reqnum += 1
        reqnum = self.reqnum.to_bytes(8, 'little', signed=False)
        name = method.encode('utf-8')
        parts = [reqnum, len(name).to_bytes(8, 'little'), name,
                 *wire.pack(args)]
        try:
            _send_frame(self.sock, parts)
            while True:
                reply = self._receive(report_every, report)
                if bytes(reply[:8]) in (reqnum, auth.VERDICT_REQNUM):
                    break  # Replies to requests abandoned before are skipped.
        except OSError as e:
            self.close()
            raise portal.Disconnected(f'{self.addr}: {e}') from None
        verdict = auth.parse_verdict(reply)
        if verdict is not None and not verdict[0]:
            # A plain handshake of ours (run.auth False) met a server with
            # `auth`.
            self.close()
            raise Refused(
                auth.auth_mismatch(self.name, verdict[1], self.addr, False),
                auth_differs=True)
        code = status.read(reply)
        if code == status.OK:
            return wire.unpack(reply[16:])
        message = bytes(reply[16:]).decode('utf-8', 'replace')
        raise _ERRORS.get(code, RemoteError)(message)

    def close(self, timeout=None):
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def _receive(self, report_every, report):
        start = time.monotonic()
        # Waits for the reply's first byte; a frame that began is read in
        # full, so a report never cuts one.
        while not select.select([self.sock], [], [], report_every or None)[0]:
            waited = time.monotonic() - start
            text = report() if callable(report) else report
            print(f'{text} (waited {waited:.0f} s).', flush=True)
        length = int.from_bytes(_read(self.sock, 8), 'little')
        if length < 16:
            raise ConnectionError(f'malformed reply of {length} bytes')
        return _read(self.sock, length)


def _handshake(sock, target, handshake, verdict):
    """Connects `sock` and sends the handshake; raises `Refused` (its
    message: the server's name) when the server refused it, or
    `auth.NoVerdict` when it answered a token without a verdict."""
    sock.settimeout(10)
    sock.connect(target)
    sock.sendall(handshake)
    if verdict:
        accepted, server = auth.read_verdict(sock)
        if not accepted:
            raise Refused(server)


def _open(host, port, ipv6, handshake, verdict):
    """A blocking socket connected to the server that made the handshake;
    raises as `_handshake` (OSError when no server took the connection)."""
    family = socket.AF_INET6 if ipv6 else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        _handshake(sock, (host, port, 0, 0) if ipv6 else (host, port),
                   handshake, verdict)
        sock.settimeout(None)
    except BaseException:
        sock.close()
        raise
    # Each message goes out in one call, so Nagle's delay only costs.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    portal_utils.set_keepalive(sock, *_KEEPALIVE)
    return sock


def _send_frame(sock, parts):
    views = [memoryview(part).cast('B') for part in parts]
    length = sum(len(view) for view in views)
    views.insert(0, memoryview(length.to_bytes(8, 'little')))
    while views:
        sent = sock.sendmsg(views)
        while sent and views:
            if sent >= len(views[0]):
                sent -= len(views.pop(0))
            else:
                views[0] = views[0][sent:]
                sent = 0


def _read(sock, size):
    buffer = memoryview(bytearray(size))
    got = 0
    while got < size:
        count = sock.recv_into(buffer[got:])
        if not count:
            raise ConnectionResetError('the server closed the connection')
        got += count
    return buffer
