"""Server addresses: where to bind, and free ports for `{auto}`.

An address is `'host:port'`, `'[ipv6]:port'` or a bare port. portal binds
every server to all interfaces whatever the address says; here a server binds
the host its address names, and loopback when it names none (or `localhost`).
"""

import socket

LOOPBACK = {False: '127.0.0.1', True: '::1'}


class PortTaken(OSError):
    """The port a server was given is used by another program."""

    def __init__(self, addr):
        super().__init__(f'Port of {addr} is already in use.')
        self.addr = addr


def split(addr):
    """`'host:port'` -> `(host, port)`; host is '' for a bare port."""
    addr = str(addr).strip()
    if addr.isdigit():
        return '', int(addr)
    if ':' not in addr:
        raise ValueError(f"Address '{addr}' needs a port: 'host:port'.")
    host, port = addr.rsplit(':', 1)
    if not port.isdigit():
        raise ValueError(f"Address '{addr}' has no numeric port.")
    return host.strip('[]'), int(port)


def bind_host(addr, ipv6=False):
    """The interface a server for `addr` binds: loopback unless named."""
    host, _ = split(addr)
    if host in ('', 'localhost', 'ip6-localhost'):
        return LOOPBACK[ipv6]
    return host


def client_addr(addr, ipv6=False):
    """The address a client on this machine connects to for `addr`."""
    host, port = split(addr)
    if host in ('', '0.0.0.0', '::'):
        host = LOOPBACK[ipv6]
    return f'{host}:{port}'  # portal splits at the last colon, no brackets.


def local_address_toward(addr):
    """The address of this machine from which it reaches `addr`
    ('host:port'): the source address the routing table picks for it (a
    UDP socket's connect sends nothing), e.g. 10.0.0.2 on a host whose
    hostname resolves to 127.0.1.1. Raises OSError when no route exists."""
    host, port = split(addr)
    host = host or 'localhost'
    family, _, _, _, target = socket.getaddrinfo(
        host, port, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.connect(target)
        return sock.getsockname()[0]


def free_ports(count, ipv6=False):
    """`count` distinct ports that are free right now.

    The sockets stay open until all ports are chosen, so the kernel cannot
    hand out the same port twice (portal's `free_port` can). Another program
    may still take one before our server binds it: servers raise `PortTaken`
    and the launcher retries with new ports.
    """
    family = socket.AF_INET6 if ipv6 else socket.AF_INET
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.bind((LOOPBACK[ipv6], 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def fill_auto(addrs, ipv6=False, avoid=()):
    """Replaces `{auto}` in each address with a distinct free port, none of
    them in `avoid` (ports free now that another server of the run binds
    later, such as JAX's coordinator)."""
    auto = [key for key, addr in addrs.items() if '{auto}' in str(addr)]
    avoid = {int(port) for port in avoid}
    ports = [port for port in free_ports(len(auto) + len(avoid), ipv6)
             if port not in avoid][:len(auto)]
    filled = dict(addrs)
    for key, port in zip(auto, ports):
        filled[key] = str(addrs[key]).format(auto=port)
    return filled
