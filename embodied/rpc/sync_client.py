"""A client without a background thread, for one request at a time.

An env worker sends its observations and waits for the actions, over and
over: with one env per process that is one round trip per env step. portal's
client (and `rpc.Client` on top of it) does the socket work in a background
thread, which costs two thread hand-offs per call. `SyncClient` speaks the
same protocol (portal's handshake, length-prefixed frames, request numbers,
the encoding of `rpc.wire`, and the error statuses of `rpc.Server`) from the
calling thread:

    client = SyncClient.connect('localhost:7000', 'Env00000', timeout=120)
    reply = client.call('act', obs, report_every=30, report='Waiting ...')
    client.close()

A lost connection raises `portal.Disconnected`; reconnecting is the caller's
choice (`connect` again, with the caller's `backoff.Backoff` so that waits
grow across reconnects). A server that refuses the handshake (`auth`) makes
`connect` print why, keep trying with back-off, and raise `Refused` when
the time is up.
"""

import select
import socket
import time

import portal
from portal import utils as portal_utils

from . import addresses
from . import auth
from . import backoff as backofflib
from . import wire
from .client import (
    BadRequest, Refused, RemoteError, Unreachable, gave_up, wait_limit)

_HANDSHAKE = b'portal_handshake'
_KEEPALIVE = (10, 10, 10)  # After, every, fails: portal's defaults.
_STATUS_ERRORS = {3: RemoteError, 4: RemoteError, 5: BadRequest}


class SyncClient:

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
        handshake = handshake.encode('utf-8')
        addr = addresses.client_addr(addr, ipv6)
        host, port = addresses.split(addr)
        backoff = backoff or backofflib.Backoff(every=report_every or 30)
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        next_report = report_every and start + report_every
        refusal = None
        differs = False  # Whether the refusal is one of run.auth.
        no_verdicts = 0  # In a row (see `auth.NO_VERDICTS`).
        while True:
            refused = False
            try:
                sock = _try_connect(host, int(port), ipv6, handshake, verdict)
                no_verdicts = 0
            except auth.NoVerdict:
                sock = None
                no_verdicts += 1
                if no_verdicts >= auth.NO_VERDICTS:
                    refused = differs = True
                    refusal = auth.auth_mismatch(name, '', addr, True)
                    backoff.report('refused', refusal, auth.still_refused(
                        name, '', addr))
            except Refused as e:
                refused, differs, no_verdicts = True, False, 0
                sock, refusal = None, auth.refusal_message(name, str(e), addr)
                backoff.report('refused', refusal, auth.still_refused(
                    name, str(e), addr))
            if sock:
                return cls(sock, addr, name)
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                if refusal:
                    raise Refused(gave_up(name, timeout, addr, differs),
                                  auth_differs=differs)
                raise Unreachable(
                    f'{name}: no server at {addr} after {timeout} s '
                    f'(run.connect_timeout).')
            if next_report and now >= next_report and not refusal:
                next_report = now + report_every
                print(f'{name}: waiting for the server at {addr} for '
                      f'{now - start:.0f} s ({wait_limit(timeout)}'
                      f').', flush=True)
            backoff.wait(deadline=deadline, cap=None if refused else (
                backofflib.NO_SERVER_WAIT))

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
        status = int.from_bytes(reply[8:16], 'little')
        if status == 0:
            return wire.unpack(reply[16:])
        message = bytes(reply[16:]).decode('utf-8', 'replace')
        raise _STATUS_ERRORS.get(status, RemoteError)(message)

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


def _try_connect(host, port, ipv6, handshake, verdict):
    """A connected socket, None when no server took the connection,
    `Refused` (its message: the server's name) when one refused it, or
    `auth.NoVerdict` when one answered its token without a verdict."""
    family = socket.AF_INET6 if ipv6 else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.settimeout(10)
        sock.connect((host, port, 0, 0) if ipv6 else (host, port))
        sock.sendall(handshake)
        accepted, server = auth.read_verdict(sock) if verdict else (True, '')
        sock.settimeout(None)
    except auth.NoVerdict:
        sock.close()
        raise
    except (OSError, socket.gaierror):
        sock.close()
        return None
    if not accepted:
        sock.close()
        raise Refused(server)
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
