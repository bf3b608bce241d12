"""portal's client with an event-driven socket loop, plus helpers.

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
"""

import collections
import itertools
import os
import select
import threading
import time

import socket

import portal
from portal import buffers
from portal import client_socket
from portal import contextlib as portal_contextlib
from portal import futures as portal_futures

from . import addresses
from . import auth
from . import backoff as backofflib
from . import wire

_POLL_MS = 200
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


# Reply status codes of `server.Server` (portal raises RuntimeError for all).
_ERRORS = {4: RemoteError, 5: BadRequest}


class ClientSocket(client_socket.ClientSocket):

    def __init__(self, addr, name='Client', start=True, report_every=30,
                 **kwargs):
        self.refusal = None  # The refusal message while refused.
        self.auth_differs = False  # Whether it was refused for run.auth.
        self.backoff = backofflib.Backoff(every=report_every)
        super().__init__(addr, name, start, **kwargs)

    def _connect(self):
        # portal's connect loop, plus the verdict on a token handshake and
        # a growing wait between attempts instead of a fixed one.
        handshake = self.options.handshake
        verdict = auth.expects_verdict(handshake)
        no_verdicts = 0  # In a row (see `auth.NO_VERDICTS`).
        while self.running:
            host, port = self.addr
            if portal_contextlib.context.resolver:
                host, port = portal_contextlib.context.resolver((host, port))
            port = int(port)
            target = (host, port, 0, 0) if self.options.ipv6 else (host, port)
            sock = self._create()
            try:
                sock.settimeout(10)
                sock.connect(target)
                sock.sendall(handshake.encode('utf-8'))
                if verdict:
                    accepted, server = auth.read_verdict(sock)
                    if not accepted:
                        raise Refused(server)
                sock.settimeout(0)
                self.refusal = None
                return sock
            except auth.NoVerdict:
                no_verdicts += 1
                cap = backofflib.NO_SERVER_WAIT
                if no_verdicts >= auth.NO_VERDICTS:
                    self._report_refusal('', f'{host}:{port}', own_auth=True)
                    cap = None
            except Refused as e:
                no_verdicts = 0
                self._report_refusal(str(e), f'{host}:{port}')
                cap = None
            except (OSError, socket.gaierror):
                no_verdicts = 0
                cap = backofflib.NO_SERVER_WAIT
            sock.close()
            self._sleep(self.backoff.next_delay(cap))
        return None

    def _sleep(self, seconds):
        deadline = time.monotonic() + seconds
        while self.running and time.monotonic() < deadline:
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))

    def require_connection(self, timeout):
        # portal waits for a connection without end; this wait also ends
        # when the client is closed, so a call blocked on a dead server does
        # not keep its thread, and with it the process, alive.
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
                sock = self._connect()
                if not sock:
                    break
                poll.register(sock, select.POLLIN)
                self.isconn.set()
                isconn = True
                if not self.options.autoconn:
                    self.wantconn.clear()
                [x() for x in self.callbacks_conn]
            try:
                mask = select.POLLIN | (select.POLLOUT if self.sendq else 0)
                poll.modify(sock, mask)
                ready = dict(poll.poll(_POLL_MS))
                if self.get_signal in ready:
                    os.read(self.get_signal, 4096)  # All wake-ups at once.
                if ready.get(sock.fileno(), 0) & _READ:
                    try:
                        recvbuf.recv(sock)
                        if recvbuf.done():
                            if self.recvq.qsize() > self.options.max_recv_queue:
                                raise RuntimeError(
                                    'Too many incoming messages enqueued')
                            msg = recvbuf.result()
                            if self._refused_by(msg):
                                raise ConnectionRefusedError('refused')
                            if self.backoff.attempts:
                                # A reply: a server that accepts and then
                                # drops each connection keeps its back-off.
                                self.backoff.reset()
                            self.recvq.put(msg)
                            [x(msg) for x in self.callbacks_recv]
                            recvbuf = buffers.RecvBuffer(maxsize)
                    except BlockingIOError:
                        pass
                if self.sendq:
                    try:
                        self.sendq[0].send(sock)
                        if self.sendq[0].done():
                            self.sendq.popleft()
                    except BlockingIOError:
                        pass
                    except ConnectionResetError:
                        pass  # Read what is left until recv fails.
            except OSError as e:
                detail = f'{type(e).__name__}: {e}' if str(e) else type(
                    e).__name__
                self._log(f'Connection to server lost ({detail})')
                self.isconn.clear()
                isconn = False
                poll.unregister(sock)
                sock.close()
                self.sendq.clear()  # As portal: resends happen above this.
                recvbuf = buffers.RecvBuffer(maxsize=maxsize)
                [x() for x in self.callbacks_disc]
        if sock:
            sock.close()

    def _refused_by(self, msg):
        """Whether `msg` is a refusal (to a plain handshake of ours that
        met a server with `auth`); records and reports it."""
        verdict = auth.parse_verdict(msg)
        if verdict is None or verdict[0]:
            return False
        self._report_refusal(
            verdict[1], f'{self.addr[0]}:{self.addr[1]}', own_auth=False)
        self._sleep(self.backoff.next_delay())
        return True

    def _report_refusal(self, server, addr, own_auth=None):
        """Reports a refusal: of the secret, or with `own_auth` (this
        command's run.auth) of a run.auth that differs."""
        self.auth_differs = own_auth is not None
        if self.auth_differs:
            self.refusal = auth.auth_mismatch(self.name, server, addr, own_auth)
        else:
            self.refusal = auth.refusal_message(self.name, server, addr)
        self.backoff.report('refused', self.refusal, auth.still_refused(
            self.name, server, addr))


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
        status = int.from_bytes(data[8:16], 'little') if len(data) >= 16 else 0
        error = _ERRORS.get(status)
        if status == 0 and len(data) >= 16:
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


def connect(addr, name, timeout=None, ipv6=None, report_every=None,
            **kwargs):
    """A connected `Client` for `addr`, or `Unreachable` after `timeout`
    seconds (None waits forever). Every `report_every` seconds of waiting it
    prints whom it waits for. Extra kwargs go to the client (`maxinflight`,
    `autoconn`, `handshake`: the run's, see `auth`; None: portal's). `ipv6`
    defaults to `portal.setup()`'s."""
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
    step = report_every or timeout
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        wait = step if left is None else min(step or left, left)
        if client.connect(None if wait is None else max(0.0, wait)):
            return client
        if deadline is not None and time.monotonic() >= deadline:
            client.close(1)
            refusal = client.socket.refusal
            if refusal:
                differs = client.socket.auth_differs
                raise Refused(
                    gave_up(name, timeout, addr, differs), auth_differs=differs)
            raise Unreachable(
                f'{name}: no server at {addr} after {timeout} s '
                f'(run.connect_timeout).')
        if client.socket.refusal:
            continue  # The socket reports the refusal itself.
        print(f'{name}: waiting for the server at {addr} for '
              f'{time.monotonic() - start:.0f} s ({wait_limit(timeout)}).',
              flush=True)


def gave_up(name, timeout, addr, auth_differs):
    """The error of a client refused until run.connect_timeout."""
    what = ('its run.auth differs' if auth_differs else
            'its run secret differs')
    return (f'{name}: gave up after {timeout} s (run.connect_timeout): the '
            f'server at {addr} kept refusing this command: {what} (see '
            f'above).')


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
