"""The private parts of portal that `embodied.rpc` stands on.

`embodied.rpc` subclasses portal's sockets, rebuilds `portal.Client.__init__`,
speaks portal's handshake and frames without portal (`client.SyncClient`) and
falls back to portal's encoder (`wire`). pyproject.toml pins the one portal
version these were written against. This test names every such symbol, so
a different portal fails here, saying what moved, instead of somewhere in
a run. Moving the pin means reading the changed parts of portal against
this list and `embodied/rpc`, then updating both.
"""

import ast
import importlib.metadata
import inspect
import os
import pathlib
import re
import textwrap

import portal
import pytest
from portal import buffers
from portal import client_socket
from portal import contextlib as portal_contextlib
from portal import futures
from portal import packlib
from portal import server_socket
from portal import utils

from embodied import rpc
from embodied.rpc import client as rpc_client

ROOT = pathlib.Path(__file__).resolve().parents[2]


def pinned_version():
    text = (ROOT / 'pyproject.toml').read_text()
    found = re.findall(r'"portal==([0-9.]+)"', text)
    assert len(found) == 1, 'pyproject.toml must pin portal to one version'
    return found[0]


def test_the_installed_portal_is_the_pinned_one():
    assert importlib.metadata.version('portal') == pinned_version(), (
        'embodied.rpc uses private parts of portal; check them against '
        'this portal (see this test module) before moving the pin.')


def params(fn):
    return list(inspect.signature(fn).parameters)


def assigned_attributes(fn):
    """Names `fn` assigns as `self.NAME = ...`."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    names = set()
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else []
        for target in targets:
            for leaf in ast.walk(target):
                if (isinstance(leaf, ast.Attribute) and
                        isinstance(leaf.value, ast.Name) and
                        leaf.value.id == 'self'):
                    names.add(leaf.attr)
    return names


# (object, attribute, its parameters or None) that embodied/rpc relies on.
METHODS = [
    # client.ClientSocket overrides _loop, _connect (with the verdict and
    # back-off) and require_connection and uses:
    (client_socket.ClientSocket, '__init__',
     ['self', 'addr', 'name', 'start', 'kwargs']),
    (client_socket.ClientSocket, '_loop', ['self']),
    (client_socket.ClientSocket, '_connect', ['self']),
    (client_socket.ClientSocket, '_log', ['self', 'args']),
    (client_socket.ClientSocket, '_create', ['self']),
    (client_socket.ClientSocket, 'require_connection', ['self', 'timeout']),
    (client_socket.ClientSocket, 'start', ['self']),
    (client_socket.ClientSocket, 'send', ['self', 'data', 'timeout']),
    (client_socket.ClientSocket, 'recv', ['self', 'timeout']),
    (buffers.RecvBuffer, '__init__', ['self', 'maxsize']),
    (buffers.RecvBuffer, 'recv', ['self', 'sock']),
    (buffers.RecvBuffer, 'done', ['self']),
    (buffers.RecvBuffer, 'result', ['self']),
    (buffers.SendBuffer, 'send', ['self', 'sock']),
    (buffers.SendBuffer, 'done', ['self']),
    # client.Client rebuilds portal.Client.__init__ and uses its callbacks:
    (portal.Client, '_recv', ['self', 'data']),
    (portal.Client, '_disc', ['self']),
    (portal.Client, '_conn', ['self']),
    (portal.Client, '_seterr', ['self', 'future', 'e']),
    (portal.Client, 'connect', ['self', 'timeout']),
    (portal.Client, 'close', ['self', 'timeout']),
    (portal.Client, 'stats', ['self']),
    (futures.Future, 'set_result', ['self', 'result']),
    (futures.Future, 'set_error', ['self', 'e']),
    (futures.Future, 'wait', ['self', 'timeout']),
    # sockets.ServerSocket overrides _recv and _handshake and uses:
    (server_socket.ServerSocket, '__init__', ['self', 'port', 'name', 'kwargs']),
    (server_socket.ServerSocket, '_recv', ['self', 'conn']),
    (server_socket.ServerSocket, '_handshake', ['self', 'conn']),
    (server_socket.ServerSocket, '_disconnect', ['self', 'conn', 'e']),
    (server_socket.ServerSocket, 'send', None),
    (server_socket.ServerSocket, 'recv', ['self', 'timeout']),
    (server_socket.ServerSocket, 'close', ['self', 'timeout']),
    (server_socket.ServerSocket, 'connections', None),
    # wire falls back to portal's encoder; SyncClient sets keep-alive.
    (packlib, 'pack', ['data']),
    (packlib, 'unpack', ['buffer']),
    (utils, 'set_keepalive', ['sock', 'after', 'every', 'fails']),
    # Processes and threads: options handed to children, worker lists.
    (portal_contextlib.context, 'options', None),
    (portal_contextlib.context, 'clientkw', None),
    (portal_contextlib.context, 'serverkw', None),
    (portal_contextlib.context, 'resolver', None),
    (portal, 'Disconnected', None),
    (portal, 'setup', None),
    (portal, 'Process', None),
]


@pytest.mark.parametrize(
    'owner, name, expected', METHODS,
    ids=[f'{getattr(o, "__name__", type(o).__name__)}.{n}'
         for o, n, _ in METHODS])
def test_private_portal_symbol_is_there(owner, name, expected):
    assert hasattr(owner, name), f'portal lost {owner}.{name}'
    if expected is not None:
        assert params(getattr(owner, name)) == expected, (
            f'{owner}.{name} changed its signature')


def test_client_rebuilds_every_attribute_portal_client_sets():
    """rpc.Client.__init__ sets portal.Client's attributes itself (to put
    its socket class under them); a new one in portal would be missing."""
    portal_sets = assigned_attributes(portal.Client.__init__)
    ours = assigned_attributes(rpc_client.Client.__init__)
    assert portal_sets == ours, (
        f'portal.Client.__init__ sets {sorted(portal_sets - ours)} that '
        f'rpc.Client does not; rpc.Client sets {sorted(ours - portal_sets)} '
        f'that portal does not')


def test_client_socket_attributes_the_loop_uses():
    sock = client_socket.ClientSocket('localhost:1', start=False)
    try:
        for name in ('options', 'isconn', 'wantconn', 'running', 'sendq',
                     'recvq', 'get_signal', 'set_signal', 'callbacks_conn',
                     'callbacks_recv', 'callbacks_disc', 'thread', 'addr',
                     'name'):
            assert hasattr(sock, name), name
        for name in ('autoconn', 'max_msg_size', 'max_recv_queue',
                     'handshake', 'ipv6'):
            assert hasattr(sock.options, name), name
        # portal starts the loop it names: the override must be the one run.
        assert sock.thread.fn.__func__ is client_socket.ClientSocket._loop
    finally:
        os.close(sock.get_signal)
        os.close(sock.set_signal)


def test_server_socket_attributes_and_the_handshake():
    server = rpc.sockets.ServerSocket('localhost:0')
    try:
        for name in ('sock', 'recvq', 'conns', 'handshake', 'options'):
            assert hasattr(server, name), name
        # SyncClient speaks the handshake without portal.
        assert server.handshake == rpc_client._HANDSHAKE
        assert client_socket.Options().handshake.encode() == (
            rpc_client._HANDSHAKE)
        conn = server_socket.Connection(None, None)
        assert conn.handshake == b'' and hasattr(conn, 'sock')
    finally:
        server.close(1)


def test_portal_threads_register_their_workers_on_the_thread():
    """rpc.Thread gives its thread a `children` list, where portal's
    context puts the workers started inside it."""
    source = inspect.getsource(portal_contextlib)
    assert 'current.children.append(worker)' in source
