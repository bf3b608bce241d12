import multiprocessing
import threading
import time

import numpy as np
import pytest

import embodied
from embodied.core import clock as clock_lib


def wait_until(condition, timeout=5):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError('condition not met in time')
        time.sleep(0.001)


@pytest.mark.parametrize('clock_type', [
    embodied.LocalClock, embodied.GlobalClock])
class TestClock:

    def test_zero_never(self, clock_type):
        clock = clock_type(0, first=True)
        assert not any(clock() for _ in range(10))

    def test_negative_always(self, clock_type):
        clock = clock_type(-1)
        assert all(clock() for _ in range(10))

    def test_first(self, clock_type):
        assert clock_type(100, first=True)() is True
        assert clock_type(100, first=False)() is False

    def test_fires_once_per_period(self, clock_type):
        clock = clock_type(0.05)
        assert not clock()  # Starts the period.
        assert not clock()
        start = time.monotonic()
        wait_until(clock)
        assert time.monotonic() - start >= 0.04
        assert not clock()  # A new period began when it fired.

    def test_skip_leaves_schedule(self, clock_type):
        clock = clock_type(0.05, first=True)
        assert clock(skip=True) is False  # Does not count as the first call.
        assert clock() is True
        assert not clock()
        wait_until(lambda: time.monotonic() >= clock.prev + clock.every)
        assert clock(skip=True) is False
        assert clock() is True  # The skipped firing is still due.
        assert clock(skip=True) is False
        assert not clock()

    def test_skip_with_special_periods(self, clock_type):
        assert clock_type(-1)(skip=True) is False
        assert clock_type(0)(skip=True) is False


# --- GlobalClock across replicas -------------------------------------------

def _replica_calls(decider, replica, clocks, calls, skips, seed):
    """Makes `calls` rounds of calls of each clock; returns the decisions."""
    rng = np.random.default_rng(seed)
    ids = [decider.create(replica, every, first) for every, first in clocks]
    decisions = []
    for n in range(calls):
        time.sleep(rng.uniform(0, 0.004))  # Replicas drift apart.
        for clockid in ids:
            skip = (replica, clockid, n) in skips
            decisions.append(decider.should(replica, clockid, skip))
    return decisions


def _run_replicas(decider, replicas, *args):
    results = [None] * replicas
    errors = []

    def body(replica):
        try:
            results[replica] = _replica_calls(decider, replica, *args, replica)
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=body, args=(r,))
               for r in range(replicas)]
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    assert not errors, errors
    return results


def test_decider_gives_every_replica_the_same_decisions():
    clocks = [(0.03, False), (-1, False), (0, True), (100, True)]
    skips = {(1, 0, 7), (0, 1, 3), (2, 3, 0)}
    decider = clock_lib.Decider(3, timeout=30)
    results = _run_replicas(decider, 3, clocks, 150, skips)
    assert results[0] == results[1] == results[2]
    table = np.array(results[0]).reshape(150, len(clocks))
    # The periodic clock fired some times, not always; the others follow
    # LocalClock's rules, and a skip by any one replica gives False for all.
    assert 2 <= table[:, 0].sum() < 150
    assert table[7, 0] == False  # noqa: E712
    assert table[:, 1].tolist() == [n != 3 for n in range(150)]
    assert not table[:, 2].any()
    # `first` is answered by the first call nobody skipped.
    assert table[:, 3].tolist() == [n == 1 for n in range(150)]
    assert not decider.rounds and not decider.decisions  # Nothing kept.


def test_decider_names_a_missing_replica_and_a_mismatch():
    decider = clock_lib.Decider(2, timeout=0.2)
    clockid = decider.create(0, 5.0, False)
    with pytest.raises(TimeoutError, match=r'replicas \[1\] did not call'):
        decider.should(0, clockid, False)
    with pytest.raises(ValueError, match='replica 1 created it with every=1'):
        decider.create(1, 1.0, False)
    with pytest.raises(ValueError, match='never created'):
        decider.should(0, 9, False)


def _replica_process(replica, port, results, done):
    import embodied
    embodied.clock.setup(
        replica == 0, replica, 2, port, f'localhost:{port}', timeout=60)
    clocks = [embodied.GlobalClock(0.05), embodied.GlobalClock(100, True),
              embodied.GlobalClock(-1)]
    rng = np.random.default_rng(replica)
    decisions = []
    for n in range(100):
        time.sleep(rng.uniform(0, 0.003))
        for clock in clocks:
            decisions.append(clock(skip=(replica == 1 and n == 5)))
    results.put((replica, decisions))
    done.wait(60)  # The server replica answers until everyone is done.
    embodied.clock.close()


def test_two_replica_processes_agree_on_every_decision():
    from embodied.rpc import addresses
    context = multiprocessing.get_context('spawn')
    results, done = context.Queue(), context.Event()
    port, = addresses.free_ports(1)
    procs = [context.Process(target=_replica_process,
                             args=(r, port, results, done))
             for r in range(2)]
    [p.start() for p in procs]
    try:
        got = dict(results.get(timeout=120) for _ in procs)
    finally:
        done.set()
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join()
    assert [p.exitcode for p in procs] == [0, 0]
    assert got[0] == got[1]
    table = np.array(got[0]).reshape(100, 3)
    assert 1 <= table[:, 0].sum() < 100
    assert table[5].tolist() == [False, False, False]  # Replica 1 skipped.
    assert table[:, 1].tolist() == [n == 0 for n in range(100)]
    assert table[:, 2].tolist() == [n != 5 for n in range(100)]


def test_setup_with_one_replica_keeps_clocks_local():
    embodied.clock.setup(True, 0, 1, 0, '')
    clock = embodied.GlobalClock(100, first=True)
    assert clock.link is None
    assert clock() is True and clock() is False


def test_setup_rejects_a_replica_out_of_range():
    with pytest.raises(ValueError, match=r'replica 2 is not in \[0, 2\)'):
        embodied.clock.setup(False, 2, 2, 0, 'localhost:1')
