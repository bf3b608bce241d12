"""The parent of a replica's command: passes the child's exit code on,
and names the lost replica when gloo or JAX ended the child by a signal;
a replica that ends itself shows its threads' stacks; and the address gloo
advertises."""

import socket
import subprocess
import sys
import textwrap

import elements
import pytest

from embodied.jax import distributed
from embodied.rpc import addresses
from embodied.run import replica_guard

CONFIG = elements.Config(replica=0, replicas=2)


def child(code):
    return [sys.executable, '-c', code]


def test_exit_code_of_the_child_is_passed_on(capfd):
    assert replica_guard.supervise(
        CONFIG, [], child('import sys; sys.exit(3)')) == 3
    assert replica_guard.supervise(CONFIG, [], child('pass')) == 0


def test_child_ended_by_gloo_names_the_lost_replica(capfd):
    code = replica_guard.supervise(CONFIG, [], child(
        "import os, sys; sys.stderr.write('[gloo] Connection closed by "
        "peer [10.0.0.2]:4242\\n'); sys.stderr.flush(); os.abort()"))
    assert code == replica_guard.EXIT_LOST
    err = capfd.readouterr().err
    assert 'Connection closed by peer' in err  # Relayed.
    lines = [x for x in err.splitlines() if x.startswith('Replica 0:')]
    assert len(lines) == 1, err
    assert 'replica 1 of 2 was lost' in lines[0]
    assert 'SIGABRT (exit code -6)' in lines[0]


def test_child_killed_otherwise_keeps_the_signal_in_its_code(capfd):
    code = replica_guard.supervise(CONFIG, [], child(
        'import os, signal; os.kill(os.getpid(), signal.SIGKILL)'))
    assert code == 128 + 9
    assert 'was lost' not in capfd.readouterr().err


def test_more_replicas_say_another_was_lost():
    line = replica_guard.lost_message(
        elements.Config(replica=2, replicas=4), -6)
    assert 'another replica of 4 was lost' in line


def test_an_error_every_replica_raised_is_no_lost_replica(monkeypatch):
    # A config mismatch names the per-replica keys, `jax.gloo_address`
    # among them; taken for a lost replica, replica 0 left at once and its
    # coordinator ended replica 1 before it printed the mismatch.
    monkeypatch.setattr(distributed, '_state', {'replica': 0, 'replicas': 2})
    text = 'run.train_ratio differs (may differ: jax.gloo_address)'
    assert distributed.lost_replica_message(
        distributed.ReplicaError(text, together=True)) is None
    assert 'lost contact with replica 1' in distributed.lost_replica_message(
        RuntimeError('Gloo connection closed by peer'))


def test_gloo_advertises_the_address_that_reaches_the_coordinator():
    assert addresses.local_address_toward('127.0.0.1:1') == '127.0.0.1'
    assert distributed.gloo_endpoint('127.0.0.1:1') == {
        'hostname': '127.0.0.1'}
    assert distributed.gloo_endpoint('127.0.0.1:1', '10.1.2.3') == {
        'hostname': '10.1.2.3'}
    names = [name for _, name in socket.if_nameindex()]
    if 'lo' not in names:
        pytest.skip('no interface named lo')
    assert distributed.gloo_endpoint('127.0.0.1:1', 'lo') == {
        'interface': 'lo'}


def test_a_replica_that_ends_itself_shows_where_its_threads_were():
    # The watchdog's end of a replica (`distributed._die`) is the only
    # trace a silent replica leaves: the stacks say where it was stuck.
    code = textwrap.dedent('''
        import threading
        from embodied.jax import distributed
        def stuck_in_a_wait(event):
            event.wait()
        event = threading.Event()
        threading.Thread(target=stuck_in_a_wait, args=(event,)).start()
        distributed._state.update(replica=1, replicas=2)
        distributed._die('Replica 1: replica 0 of 2 was lost.')
    ''')
    result = subprocess.run(
        child(code), capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    err = result.stderr
    assert err.startswith('Replica 1: replica 0 of 2 was lost.\n'), err
    assert 'Replica 1 ends; its threads were at:' in err
    assert 'in stuck_in_a_wait' in err and '(most recent call first)' in err
    assert 'in _die' in err  # The main thread's stack as well.
