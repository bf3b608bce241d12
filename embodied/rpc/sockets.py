"""portal's server socket, hardened against bad peers and bound to a host.

portal's `ServerSocket` stops serving everyone when one peer sends a frame
whose length prefix is zero or too large (an assertion escapes its loop), and
spins when a peer closes during the handshake. This subclass drops just that
connection instead. It binds the host of its address (loopback by default),
accepts port 0 (the kernel picks; see `port`), and raises `PortTaken` when the
port is used by another program.

With `auth` (`auth.Credentials`), a peer must open with the run's handshake
(see `auth`); any other is told it was refused (`auth.verdict_frame`) and
dropped before a frame of it is read, and `control` holds the peers that
opened with the launcher's control token. `refused_from` keeps the
addresses of the last refused peers.
With `max_frame`, a frame whose length prefix exceeds it drops that peer
before anything is allocated for it (replies are not limited).
"""

import collections
import errno
import socket

from portal import buffers
from portal import server_socket

from . import addresses
from . import auth as authlib


_REPORTED_REFUSALS = 3  # Printed refusals per server; the rest are counted.


class ServerSocket(server_socket.ServerSocket):

    def __init__(self, addr, name='Server', ipv6=False, auth=None,
                 max_frame=None, **kwargs):
        host = addresses.bind_host(addr, ipv6)
        _, port = addresses.split(addr)
        self.dropped = 0  # Connections dropped for malformed input.
        self.refused = 0  # Connections dropped for a wrong handshake.
        self.auth = auth
        self.max_frame = max_frame
        self.control = set()  # Addresses of peers with the control token.
        self.refused_from = collections.deque(maxlen=5)  # 'host:port'
        if auth is not None:
            kwargs['handshake'] = auth.handshake()
        try:
            super().__init__(port, name, host=host, ipv6=ipv6, **kwargs)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise addresses.PortTaken(addr) from None
            raise

    @property
    def port(self):
        return self.sock.getsockname()[1]

    def wake(self, item):
        """Puts `item` into the receive queue, waking a blocked `recv()`."""
        self.recvq.put(item)

    def drop(self, addr):
        """Closes the connection to `addr`; safe from any thread.

        Shutting the socket down makes the socket thread see end-of-stream
        and disconnect it there, so connection state has a single writer.
        """
        conn = self.conns.get(addr)
        if conn is None:
            return
        self.dropped += 1
        try:
            conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _recv(self, conn):
        if self.max_frame and not conn.recvbuf:
            conn.recvbuf = buffers.RecvBuffer(self.max_frame)
        try:
            super()._recv(conn)
        except AssertionError:
            # RecvBuffer asserts 1 <= length <= max_msg_size on the prefix.
            self.dropped += 1
            self._disconnect(conn, ValueError('frame length out of range'))

    def _handshake(self, conn):
        size = len(self.handshake) - len(conn.handshake)
        part = conn.sock.recv(size)
        if not part:
            raise ConnectionResetError('closed during handshake')
        conn.handshake += part
        if self.auth is not None:
            return self._check_token(conn)
        if conn.handshake != self.handshake[:len(conn.handshake)]:
            self.dropped += 1
            self.refused += 1
            self._disconnect(conn, ValueError('wrong handshake'))

    def _check_token(self, conn):
        # The common prefix is checked as it arrives; the token once whole,
        # as either the data or the control token.
        prefix = len(self.handshake) - 64
        head = conn.handshake[:prefix]
        if head != self.handshake[:len(head)]:
            kind = None
        elif len(conn.handshake) < len(self.handshake):
            return
        else:
            kind = self.auth.kind(bytes(conn.handshake))
        if kind is None:
            self.dropped += 1
            self.refused += 1
            self.refused_from.append(f'{conn.addr[0]}:{conn.addr[1]}')
            self._tell(conn, False)
            if self.refused <= _REPORTED_REFUSALS:
                peer = f'{conn.addr[0]}:{conn.addr[1]}'
                if _plain(conn.handshake):
                    print(f'{self.name}: refused a connection from {peer}: '
                          f'run.auth differs (that command has run.auth '
                          f'False, this one run.auth True; see run.auth in '
                          f'docs/faults.md).', flush=True)
                else:
                    print(f'{self.name}: refused a connection from {peer} '
                          f'without the run\'s secret (see run.auth in '
                          f'docs/faults.md).', flush=True)
            self._disconnect(conn, PermissionError('wrong handshake'))
        else:
            if kind == 'control':
                self.control.add(conn.addr)
            self._tell(conn, True)

    def _tell(self, conn, accepted):
        # Sent before any reply can be queued for this peer; a few dozen
        # bytes fit in a fresh socket's buffer.
        try:
            conn.sock.send(authlib.verdict_frame(accepted, self.name))
        except OSError:
            pass

    def _disconnect(self, conn, e):
        self.control.discard(conn.addr)
        super()._disconnect(conn, e)


def _plain(handshake):
    """Whether a peer opened with portal's plain handshake (run.auth False)
    rather than a token."""
    plain = authlib.PORTAL_HANDSHAKE.encode()
    return bytes(handshake[:len(plain) + 1]) != plain + b':' and bytes(
        handshake).startswith(plain)
