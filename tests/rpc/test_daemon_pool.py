"""`DaemonPool`: futures as `ThreadPoolExecutor` gives them, and no job,
however long it waits, holds the interpreter's exit."""

import os
import pathlib
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from embodied.rpc import daemon_pool

ROOT = str(pathlib.Path(__file__).resolve().parents[2])


def test_results_errors_and_cancelled_jobs():
    pool = daemon_pool.DaemonPool(2, 'test')
    assert pool.submit(lambda x, y=1: x + y, 2, y=3).result(5) == 5
    with pytest.raises(ValueError, match='bad'):
        pool.submit(lambda: (_ for _ in ()).throw(ValueError('bad'))).result(5)
    release = threading.Event()
    busy = [pool.submit(release.wait, 10) for _ in range(2)]
    while not all(f.running() for f in busy):
        time.sleep(0.01)
    waiting = pool.submit(lambda: 'never')
    assert len(pool._threads) == 2  # At most `workers` threads.
    pool.shutdown(wait=False, cancel_futures=True)
    assert waiting.cancelled()
    with pytest.raises(RuntimeError, match='shut down'):
        pool.submit(lambda: None)
    release.set()
    assert [f.result(5) for f in busy] == [True, True]
    assert all(t.daemon for t in pool._threads)


def test_threads_are_reused():
    pool = daemon_pool.DaemonPool(4, 'test')
    for value in range(20):
        assert pool.submit(lambda v=value: v).result(5) == value
    assert len(pool._threads) == 1
    pool.shutdown()


# A server whose method waits forever on a peer that never answers, with
# one request in it; then the main thread ends.
HANGING = textwrap.dedent('''
    import threading, time
    import numpy as np
    from embodied import rpc
    started = threading.Event()
    def wait_forever(data):
        started.set()
        threading.Event().wait()
    server = rpc.Server('localhost:0', 'Test', flush_after=0.01)
    server.bind('act', wait_forever, batch=1)
    server.start()
    client = rpc.connect(server.port, 'TestClient', timeout=10)
    client.act({'x': np.zeros((1, 1), np.float32)})
    assert started.wait(10)
    print('waiting', flush=True)
''')


def test_a_job_that_never_returns_holds_no_exit():
    """With `concurrent.futures.ThreadPoolExecutor` the interpreter joins
    the job's thread at exit without a timeout and never exits."""
    result = subprocess.run(
        [sys.executable, '-c', HANGING], capture_output=True, text=True,
        timeout=60, env={**os.environ, 'PYTHONPATH': ROOT})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout == 'waiting\n'
