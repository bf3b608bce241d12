"""Tests of the RPC layer: addresses, the batching server, workers."""

import os
import pathlib
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from multiprocessing import resource_tracker

import numpy as np
import portal
import psutil
import pytest

from embodied import rpc

# Spawned children need multiprocessing's resource tracker; starting it now
# keeps it out of the per-test leftover check.
resource_tracker.ensure_running()


@pytest.fixture
def client_for():
    clients = []

    def make(server, **kwargs):
        client = rpc.connect(server.port, 'TestClient', timeout=10, **kwargs)
        clients.append(client)
        return client
    yield make
    for client in clients:
        client.close(1)


def rows(value, n=1, width=1):
    return {'x': np.full((n, width), value, np.float32)}


# Addresses


@pytest.mark.parametrize('addr, host', [
    ('1234', '127.0.0.1'),
    ('localhost:1234', '127.0.0.1'),
    ('0.0.0.0:1234', '0.0.0.0'),
    ('10.1.2.3:1234', '10.1.2.3'),
])
def test_bind_host_is_loopback_unless_named(addr, host):
    assert rpc.addresses.bind_host(addr) == host


def test_free_ports_are_distinct():
    ports = rpc.addresses.free_ports(20)
    assert len(set(ports)) == 20


def test_fill_auto_gives_distinct_ports():
    addrs = {'a': 'localhost:{auto}', 'b': 'localhost:{auto}', 'c': 'x:5'}
    filled = rpc.addresses.fill_auto(addrs)
    assert filled['c'] == 'x:5'
    assert filled['a'] != filled['b']
    assert filled['a'].startswith('localhost:')


def test_fill_auto_avoids_the_ports_it_is_told(monkeypatch):
    """The kernel may offer JAX's coordinator port, free until replica 0's
    agent binds it (seen in CI: the actor took it, every replica ended)."""
    offered = iter([[4001, 4002, 4003], [4001, 4002, 4003]])
    monkeypatch.setattr(
        rpc.addresses, 'free_ports', lambda count, ipv6=False: next(offered))
    addrs = {'a': 'localhost:{auto}', 'b': 'localhost:{auto}'}
    assert rpc.addresses.fill_auto(addrs, avoid=['4001']) == {
        'a': 'localhost:4002', 'b': 'localhost:4003'}
    assert rpc.addresses.fill_auto(addrs) == {
        'a': 'localhost:4001', 'b': 'localhost:4002'}


def test_server_binds_loopback_only():
    with rpc.Server('localhost:0', 'Test') as server:
        assert server.socket.sock.getsockname()[0] == '127.0.0.1'


def test_taken_port_raises_port_taken():
    with rpc.Server('localhost:0', 'First') as first:
        with pytest.raises(rpc.PortTaken):
            rpc.Server(f'localhost:{first.port}', 'Second')


# Server


def test_plain_method_and_unknown_method(client_for):
    server = rpc.Server('localhost:0', 'Test')
    server.bind('echo', lambda x: x)
    with server:
        client = client_for(server)
        assert client.echo({'a': 1}).result()['a'] == 1
        with pytest.raises(RuntimeError, match="Unknown method 'nope'"):
            client.call('nope').result()
        assert client.echo(2).result() == 2


def test_full_batches_run_together(client_for):
    sizes = []

    def double(data):
        sizes.append(len(data['x']))
        return {'y': data['x'] * 2}
    server = rpc.Server('localhost:0', 'Test', flush_after=5)
    server.bind('act', double, batch=4)
    with server:
        client = client_for(server)
        futures = [client.act(rows(i)) for i in range(8)]
        results = [f.result()['y'][0, 0] for f in futures]
    assert results == [2 * i for i in range(8)]
    assert sizes == [4, 4]


def test_requests_with_several_rows_count_rows(client_for):
    sizes = []

    def ident(data):
        sizes.append(len(data['x']))
        return {'y': data['x']}
    server = rpc.Server('localhost:0', 'Test', flush_after=5)
    server.bind('act', ident, batch=4)
    with server:
        client = client_for(server)
        first = client.act(rows(1, n=3))
        second = client.act(rows(2, n=1))
        assert first.result()['y'].shape == (3, 1)
        assert (second.result()['y'] == 2).all()
    assert sizes == [4]


def test_one_env_requests_of_the_original_batch_with_rows(client_for):
    """The original's env process sends one env per request (a scalar
    `envid`, unbatched leaves, Python ints as int64); such a request is one
    row of a batch with row requests, and its reply comes back unbatched."""
    batches = []

    def policy(data):
        batches.append({k: v.copy() for k, v in data.items()})
        return {'action': data['envid'] * 10, 'reset': data['is_last']}
    server = rpc.Server('localhost:0', 'Test', flush_after=5)
    server.bind('act', policy, batch=4)
    with server:
        ours = client_for(server)
        original = portal.Client(f'localhost:{server.port}', 'Original')
        try:
            rows_reply = ours.act({
                'envid': np.array([0, 1], np.int32),
                'image': np.zeros((2, 3, 3), np.uint8),
                'is_last': np.array([False, True])})
            # Ours first: its rows wait in the queue before the others send.
            deadline = time.monotonic() + 10
            while server.methods['act'].rows < 2:
                assert time.monotonic() < deadline
                time.sleep(0.005)
            singles = [original.act({
                'envid': envid, 'image': np.full((3, 3), envid, np.uint8),
                'is_last': False}) for envid in (2, 3)]
            rows_reply = rows_reply.result(timeout=10)
            single_replies = [f.result(timeout=10) for f in singles]
        finally:
            original.close()
    assert len(batches) == 1
    batch = batches[0]
    np.testing.assert_array_equal(batch['envid'], [0, 1, 2, 3])
    assert batch['envid'].dtype == np.int32
    assert batch['image'].shape == (4, 3, 3)
    np.testing.assert_array_equal(batch['image'][3], np.full((3, 3), 3))
    np.testing.assert_array_equal(rows_reply['action'], [0, 10])
    for envid, reply in zip((2, 3), single_replies):
        assert reply['action'].shape == () and reply['action'] == 10 * envid
        assert reply['reset'].shape == () and not reply['reset']


def test_partial_batch_flushes_after_timeout(client_for):
    server = rpc.Server('localhost:0', 'Test', flush_after=0.05)
    server.bind('act', lambda data: {'y': data['x']}, batch=8)
    with server:
        client = client_for(server)
        start = time.monotonic()
        result = client.act(rows(3)).result(timeout=5)
        assert time.monotonic() - start < 2
        assert result['y'][0, 0] == 3
        assert server.stats()['act/partial'] == 1


def test_mismatched_request_gets_error_and_others_continue(client_for):
    server = rpc.Server('localhost:0', 'Test', flush_after=0.01)
    server.bind('act', lambda data: {'y': data['x']}, batch=2)
    with server:
        client = client_for(server)
        assert client.act(rows(1)).result()['y'][0, 0] == 1
        with pytest.raises(rpc.BadRequest, match=r"'x' expected dtype float32 "
                           r"shape \(1,\) per row, got dtype float32 shape "
                           r"\(3,\)"):
            client.act(rows(1, width=3)).result()
        with pytest.raises(RuntimeError, match='missing'):
            client.act({'z': np.zeros((1, 1), np.float32)}).result()
        # A scalar makes the request one unbatched row, of the wrong shape.
        with pytest.raises(rpc.BadRequest, match=r"'x' expected dtype float32 "
                           r"shape \(1,\) per row, got dtype float32 shape "
                           r"\(\)"):
            client.act({'x': np.float32(1)}).result()
        with pytest.raises(RuntimeError, match='first axis'):
            client.act({'x': 'text'}).result()
        assert client.act(rows(5)).result()['y'][0, 0] == 5


@pytest.mark.parametrize('payload', [
    (0).to_bytes(8, 'little'),                             # zero-length frame
    (2 ** 62).to_bytes(8, 'little'),                       # oversized frame
    (20).to_bytes(8, 'little') + b'\xff' * 20,             # undecodable
])
def test_malformed_frames_drop_only_that_connection(client_for, payload):
    server = rpc.Server('localhost:0', 'Test')
    server.bind('echo', lambda x: x)
    with server:
        client = client_for(server)
        assert client.echo(1).result() == 1
        with socket.create_connection(('127.0.0.1', server.port)) as sock:
            sock.sendall(b'portal_handshake' + payload)
            sock.settimeout(5)
            assert sock.recv(16) == b''  # The server hung up on us.
        assert client.echo(2).result() == 2
        assert server.stats()['dropped'] == 1


def test_peer_closing_during_handshake_does_not_stall_server(client_for):
    server = rpc.Server('localhost:0', 'Test')
    server.bind('echo', lambda x: x)
    with server:
        for _ in range(3):
            socket.create_connection(('127.0.0.1', server.port)).close()
        assert client_for(server).echo(3).result(timeout=5) == 3
        assert server.socket.error is None


def test_postfn_runs_in_request_order_after_reply(client_for):
    posted = []
    release = threading.Event()

    def work(data):
        if data['x'][0, 0] == 0:
            release.wait(5)  # The first batch finishes last.
        return {'y': data['x']}, data['x'][0, 0]
    server = rpc.Server('localhost:0', 'Test', flush_after=0.01)
    server.bind('act', work, postfn=posted.append, batch=1, workers=2)
    with server:
        client = client_for(server)
        first = client.act(rows(0))
        second = client.act(rows(1))
        assert second.result(timeout=5)['y'][0, 0] == 1
        assert posted == []  # Waits for the earlier request's postfn.
        release.set()
        first.result(timeout=5)
        deadline = time.monotonic() + 5
        while len(posted) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert posted == [0, 1]


def test_error_in_method_is_replied_and_kept(client_for):
    def fail(data):
        raise ValueError('bad data')
    server = rpc.Server('localhost:0', 'Test', flush_after=0.01)
    server.bind('act', fail, batch=1)
    with server:
        client = client_for(server)
        with pytest.raises(rpc.RemoteError, match='ValueError: bad data'):
            client.act(rows(1)).result(timeout=5)
        with pytest.raises(ValueError, match='bad data'):
            server.raise_error()


def test_pause_answer_and_idle(client_for):
    server = rpc.Server('localhost:0', 'Test', flush_after=0.01)
    server.bind('act', lambda data: {'y': data['x']}, batch=1)
    with server:
        client = client_for(server)
        server.pause('act')
        held = client.act(rows(1))
        assert not held.wait(0.3)
        assert server.idle('act')  # Queued requests have not started.
        server.answer('act', {'stop': True})
        assert held.result(timeout=5)['stop']
        assert client.act(rows(2)).result(timeout=5)['stop']


# Workers


def _return(value):
    return value


def _exit(code):
    sys.exit(code)


def _raise():
    raise ValueError('boom')


@pytest.mark.parametrize('kind', [rpc.Process, rpc.Thread])
@pytest.mark.parametrize('fn, args, code', [
    (_return, (None,), 0), (_return, (3,), 3), (_return, ('text',), 0),
    (_exit, (0,), 0), (_exit, (4,), 4), (_raise, (), 1),
])
def test_worker_exit_codes(kind, fn, args, code):
    worker = kind(fn, *args, name='Test').start()
    worker.join(60)
    assert worker.exitcode == code


def test_supervisor_names_failed_worker():
    group = rpc.Supervisor()
    group.add(rpc.Thread(_return, 0, name='Fine'))
    group.add(rpc.Thread(_return, 3, name='Broken'))
    group.start()
    assert not group.wait(10)
    with pytest.raises(rpc.WorkerFailed, match="'Broken'.*exit code 3"):
        group.check(expected=['Fine'])


def test_supervisor_starts_its_processes_before_its_threads():
    """A process that Python starts while another thread changes the
    environment (as JAX does when the agent's thread imports and starts it)
    can fail to exec: exit code 255, no output. So the threads start once
    every process has: here the thread finds each process started."""
    group = rpc.Supervisor()
    seen = []
    group.add(rpc.Thread(
        lambda: seen.extend(w.pid for w in group.workers[1:]), name='Agent'))
    for index in range(3):
        group.add(rpc.Process(_return, 0, name=f'Worker{index}'))
    group.start()
    assert not group.wait(120)
    assert len(seen) == 3 and None not in seen, seen
    assert [w.exitcode for w in group.workers] == [0, 0, 0, 0]


CHILD_SCRIPT = textwrap.dedent('''
    import time
    from embodied import rpc

    def sleeper():
        time.sleep(600)

    if __name__ == '__main__':
        workers = [rpc.Process(sleeper, name=f'S{i}').start() for i in range(2)]
        print(' '.join(str(w.pid) for w in workers), flush=True)
        time.sleep(600)
''')


def test_children_die_when_launcher_is_killed(tmp_path):
    script = tmp_path / 'launcher.py'
    script.write_text(CHILD_SCRIPT)
    root = str(pathlib.Path(__file__).resolve().parents[2])
    env = {**os.environ, 'PYTHONPATH': root}
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
        env=env)
    try:
        pids = [int(x) for x in proc.stdout.readline().split()]
        assert len(pids) == 2
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(p) for p in pids)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def _alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_portal_client_talks_to_server_over_loopback_name(client_for):
    server = rpc.Server('localhost:0', 'Test')
    server.bind('echo', lambda x: x)
    with server:
        client = portal.Client(f'localhost:{server.port}', 'Plain',
                               logging=False)
        try:
            assert client.echo(7).result(timeout=10) == 7
        finally:
            client.close(1)


def test_idle_client_sleeps(client_for):
    server = rpc.Server('localhost:0', 'Test')
    server.bind('echo', lambda x: x)
    with server:
        client = client_for(server)
        for _ in range(5):  # A burst, which left portal's loop spinning.
            client.echo(1)
        assert client.echo(2).result(timeout=5) == 2
        time.sleep(0.3)
        start = time.process_time()
        time.sleep(1.0)
        used = time.process_time() - start
    assert used < 0.1, f'idle client and server used {used:.3f} s of CPU'


def test_client_reconnects_after_server_restart():
    port = rpc.addresses.free_ports(1)[0]
    server = rpc.Server(f'localhost:{port}', 'First')
    server.bind('echo', lambda x: x)
    server.start()
    client = rpc.connect(port, 'Test', timeout=10, autoconn=False)
    try:
        assert client.echo(1).result(timeout=5) == 1
        server.close()
        with pytest.raises(portal.Disconnected):
            for _ in range(50):
                client.echo(2).result(timeout=5)
                time.sleep(0.05)
        server = rpc.Server(f'localhost:{port}', 'Second')
        server.bind('echo', lambda x: x)
        server.start()
        assert client.connect(10)
        assert client.echo(3).result(timeout=5) == 3
    finally:
        client.close(1)
        server.close()


def test_a_call_waiting_for_a_lost_server_runs_the_check():
    """The launcher's call to a role whose worker died: portal would wait
    for the connection without end (a replica's stop hung so in CI); the
    client's `check` runs while it waits and ends the call."""
    server = rpc.Server('localhost:0', 'Role')
    server.bind('echo', lambda x: x)
    server.start()
    gone = threading.Event()

    def check():
        if gone.is_set():
            raise rpc.WorkerFailed('Role', -6)
    client = rpc.connect(server.port, 'Launcher', timeout=10, check=check)
    try:
        assert client.echo(1).result(timeout=5) == 1
        server.close()
        deadline = time.monotonic() + 10
        while client.connected and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not client.connected
        gone.set()
        result = []
        caller = threading.Thread(target=lambda: result.append(
            _raised(lambda: client.call('echo', 2))), daemon=True)
        caller.start()
        caller.join(10)
        assert not caller.is_alive(), 'the call still waits for the server'
        assert isinstance(result[0], rpc.WorkerFailed), result
    finally:
        client.close(1)


def _raised(fn):
    try:
        fn()
    except Exception as e:
        return e
    return None


def _bind_taken(port):
    rpc.Server(f'localhost:{port}', 'Second')


@pytest.mark.parametrize('kind', [rpc.Process, rpc.Thread])
def test_taken_port_gives_retry_exit_code(kind):
    with rpc.Server('localhost:0', 'First') as first:
        worker = kind(_bind_taken, first.port, name='Taken').start()
        worker.join(60)
    assert worker.exitcode == rpc.supervisor.EXIT_PORT_TAKEN


# The thread-free client of env workers


def test_sync_client_calls_batched_and_plain_methods():
    server = rpc.Server('localhost:0', 'Test', flush_after=0.01)
    server.bind('act', lambda data: {'y': data['x'] * 2}, batch=2)
    server.bind('echo', lambda *args: list(args))
    with server:
        client = rpc.SyncClient.connect(f'localhost:{server.port}', 'Sync', 10)
        big = {'x': np.arange(2 * 70000, dtype=np.float32).reshape(2, 70000)}
        for _ in range(3):
            reply = client.call('act', big)  # Several MB: partial sends.
            np.testing.assert_array_equal(reply['y'], big['x'] * 2)
        assert client.call('echo', 'a', 3)[0] == 'a'
        with pytest.raises(rpc.BadRequest, match="'x' expected dtype"):
            client.call('act', rows(1, width=3))
        with pytest.raises(rpc.RemoteError, match='Unknown method'):
            client.call('nope')
        assert client.call('act', rows(4, width=70000))['y'][0, 0] == 8
        client.close()


def test_sync_client_reports_waits_and_sees_the_server_go(capsys):
    release = threading.Event()
    server = rpc.Server('localhost:0', 'Test')
    server.bind('slow', lambda: release.wait(10) and 'done')
    server.start()
    client = rpc.SyncClient.connect(f'localhost:{server.port}', 'Sync', 10)
    threading.Timer(0.5, release.set).start()
    assert client.call('slow', report_every=0.2, report='Waiting here') == (
        'done')
    assert 'Waiting here (waited 0 s)' in capsys.readouterr().out
    server.close()
    with pytest.raises(portal.Disconnected):
        client.call('slow')
    client.close()


def test_sync_client_connect_gives_up_after_timeout():
    port = rpc.addresses.free_ports(1)[0]
    start = time.monotonic()
    with pytest.raises(rpc.Unreachable, match=f'localhost:{port}'):
        rpc.SyncClient.connect(f'localhost:{port}', 'Sync', timeout=0.5)
    assert time.monotonic() - start < 5
