"""portal's server socket, hardened against bad peers and bound to a host.

portal's `ServerSocket` stops serving everyone when one peer sends a frame
whose length prefix is zero or too large (an assertion escapes its loop), and
spins when a peer closes during the handshake. This subclass drops just that
connection instead. It binds the host of its address (loopback by default),
accepts port 0 (the kernel picks; see `port`), and raises `PortTaken` when the
port is used by another program.
"""

import errno
import socket

from portal import server_socket

from . import addresses


class ServerSocket(server_socket.ServerSocket):

    def __init__(self, addr, name='Server', ipv6=False, **kwargs):
        host = addresses.bind_host(addr, ipv6)
        _, port = addresses.split(addr)
        self.dropped = 0  # Connections dropped for malformed input.
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
        if conn.handshake != self.handshake[:len(conn.handshake)]:
            self.dropped += 1
            self._disconnect(conn, ValueError('wrong handshake'))
