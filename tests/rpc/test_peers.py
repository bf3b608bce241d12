"""Peers of a run: only those with the run's secret are served, control
methods only for the launcher, and requests are bounded in size."""

import socket

import numpy as np
import portal
import pytest

from embodied import rpc
from embodied.rpc import auth
from embodied.run.parallel import connections
import launch
from tests.run.parallel.test_parallel import progress_step, run_to_end
from tests.run.parallel.test_faults import FAST, wait_first_step

CREDS = auth.Credentials.from_secret('test-secret')
WORKER = CREDS.for_workers()


def serve(**kwargs):
    server = rpc.Server(
        'localhost:0', 'Test', flush_after=0.01, auth=WORKER,
        control=('shutdown',), **kwargs)
    server.bind('act', lambda data: {'y': data['x'] + 1}, batch=1)
    server.bind('shutdown', lambda: 'bye')
    return server


def client(server, handshake, **kwargs):
    return rpc.connect(
        server.port, 'TestClient', timeout=10, handshake=handshake, **kwargs)


def hung_up(sock):
    sock.settimeout(10)
    try:
        return sock.recv(16) == b''
    except ConnectionResetError:
        return True


def test_workers_get_the_data_token_only():
    encoded = WORKER.encode()
    assert CREDS.control not in encoded and 'test-secret' not in encoded
    decoded = auth.Credentials.decode(encoded)
    assert decoded.kind(CREDS.handshake(control=True).encode()) == 'control'
    with pytest.raises(PermissionError):
        decoded.handshake(control=True)


def test_peer_without_the_secret_is_refused_before_any_method():
    with serve() as server:
        plain = portal.Client(f'localhost:{server.port}', 'Plain')
        try:
            future = plain.call('shutdown')
            with pytest.raises(Exception):
                future.result(timeout=3)
        finally:
            plain.close(1)
        wrong = auth.Credentials.from_secret('other').handshake()
        with socket.create_connection(('127.0.0.1', server.port), 5) as sock:
            sock.sendall(wrong.encode() + (20).to_bytes(8, 'little'))
            sock.settimeout(10)
            # Told it was refused, by whom, then hung up on.
            assert auth.read_verdict(sock) == (False, 'Test')
            assert hung_up(sock)
        assert server.stats()['refused'] >= 2
        ours = client(server, WORKER.handshake())
        try:
            assert ours.act({'x': np.ones((1, 2))}).result(timeout=10)[
                'y'][0, 0] == 2
        finally:
            ours.close(1)


def test_control_methods_only_for_the_launcher():
    with serve() as server:
        worker = client(server, WORKER.handshake())
        launcher = client(server, CREDS.handshake(control=True))
        try:
            with pytest.raises(rpc.BadRequest, match='only the launcher'):
                worker.shutdown().result(timeout=10)
            assert launcher.shutdown().result(timeout=10) == 'bye'
        finally:
            worker.close(1)
            launcher.close(1)


def test_frame_over_the_limit_closes_that_connection_only():
    with serve(max_frame=1 << 20) as server:
        with socket.create_connection(('127.0.0.1', server.port), 5) as sock:
            sock.sendall(WORKER.handshake().encode() + (4 << 30).to_bytes(
                8, 'little'))
            sock.settimeout(10)
            assert auth.read_verdict(sock) == (True, 'Test')
            assert hung_up(sock)
        ours = client(server, WORKER.handshake())
        try:
            reply = ours.act({'x': np.ones((1, 1000))}).result(timeout=10)
            assert reply['y'].shape == (1, 1000)
        finally:
            ours.close(1)
        assert server.stats()['dropped'] >= 1


def test_frame_limit_derived_from_the_spaces():
    from embodied import main
    config = main.parse(['--configs', 'debug', '--task', 'dummy_disc'])
    limit = connections.frame_limit(config, main.replay_spaces(config))
    big = config.update({'env.dummy.size': [512, 512], 'batch_size': 64})
    assert connections.frame_limit(big, main.replay_spaces(big)) > limit


@pytest.mark.slow
def test_unauthenticated_shutdown_and_oversized_frames_do_not_stop_a_run(
        tmp_path):
    logdir = tmp_path / 'run'

    def attack(run, tree):
        wait_first_step(run, tree)
        for port in launch.launch_ports(run.output()):
            plain = portal.Client(f'127.0.0.1:{port}', 'Intruder')
            try:
                with pytest.raises(Exception):
                    plain.call('shutdown').result(timeout=3)
            finally:
                plain.close(1)
            with socket.create_connection(('127.0.0.1', port), 5) as sock:
                sock.sendall(b'portal_handshake' + (4 << 30).to_bytes(
                    8, 'little'))
                sock.settimeout(10)
                assert auth.read_verdict(sock)[0] is False
                assert hung_up(sock)
        step = progress_step(run.output())
        run.wait_for(lambda: progress_step(run.output()) > step + 100,
                     what='steps after the attack')
        run.terminate()

    output = run_to_end(logdir, *FAST, '--run.steps', '1e9', during=attack)
    assert 'Received a stop signal' in output
    assert 'refused a connection' in output
    assert launch.saved_tags(logdir, 'agent')
