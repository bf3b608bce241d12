"""Workers restarted when they crash (`rpc.supervisor.RestartingGroup`)."""

import collections
import time

import pytest

from embodied import rpc

pytestmark = pytest.mark.timeout(120)

Spec = collections.namedtuple('Spec', 'name make')


def _exit_with(code):
    return code


def test_restarting_group_restarts_with_backoff_then_fails():
    crashes = []
    spec = Spec('Env00000', lambda: rpc.Process(_exit_with, 3, name='Env00000'))
    pool = rpc.supervisor.RestartingGroup(
        [spec], max_restarts=2, backoff=0.05,
        on_crash=lambda spec, code, error: crashes.append(code),
        setting='run.env_restarts')
    pool.start()
    try:
        with pytest.raises(rpc.WorkerFailed, match=r'crashed 3 times, more '
                           r'than run.env_restarts \(2\) allows'):
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                pool.poll()
                time.sleep(0.02)
        assert crashes == [3, 3]
        assert pool.restarts == 2
    finally:
        pool.kill()


def test_restarting_group_ends_at_once_on_a_fatal_exit_code():
    spec = Spec('Env00001', lambda: rpc.Process(_exit_with, 78, name='Env00001'))
    pool = rpc.supervisor.RestartingGroup([spec], max_restarts=5, fatal=(78,))
    pool.start()
    try:
        with pytest.raises(rpc.WorkerFailed, match='exit code 78'):
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                pool.poll()
                time.sleep(0.02)
        assert pool.restarts == 0
    finally:
        pool.kill()
