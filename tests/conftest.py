"""Shared test setup: CPU JAX, no process of a test left behind, the
fixtures that pin the compute dtype of `embodied.jax.nets`, and
`tests/support` on the path for the shared helpers (`import helpers`,
`import launch`, `from fixtures.compat_agent import ...`).

Every test folder is a package under `tests`, so a folder such as
`tests/jax` imports as `tests.jax` and cannot shadow the library it tests."""

import os
import pathlib
import sys
import time

os.environ.setdefault('JAX_PLATFORMS', 'cpu')
os.environ.setdefault('PYTHONUNBUFFERED', '1')

SUPPORT = str(pathlib.Path(__file__).resolve().parent / 'support')
if SUPPORT not in sys.path:
    sys.path.insert(0, SUPPORT)

import psutil
import pytest


def _children():
    result = {}
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            # Python's multiprocessing resource tracker is started lazily by
            # the first spawned process and lives as long as the test process.
            if 'resource_tracker' in ' '.join(p.cmdline()):
                continue
        except psutil.NoSuchProcess:
            continue
        result[p.pid] = p
    return result


@pytest.fixture
def bf16_compute(monkeypatch):
    """Pins `embodied.jax.nets.COMPUTE_DTYPE` to the original's default,
    bfloat16: an agent built earlier in the same process sets the global
    from its config."""
    import jax.numpy as jnp
    from embodied.jax import nets
    monkeypatch.setattr(nets, 'COMPUTE_DTYPE', jnp.bfloat16)


@pytest.fixture
def f32_compute(bf16_compute, monkeypatch):
    """Pins `embodied.jax.nets.COMPUTE_DTYPE` to float32."""
    import jax.numpy as jnp
    from embodied.jax import nets
    monkeypatch.setattr(nets, 'COMPUTE_DTYPE', jnp.float32)


@pytest.fixture(autouse=True)
def no_leftover_processes():
    """Fails a test that leaves a child process of the test process alive.

    Processes started with `subprocess` by the test are children too, so this
    covers launched commands as well as portal workers.
    """
    before = set(_children())
    yield
    deadline = time.monotonic() + 10
    leftover = {}
    while time.monotonic() < deadline:
        leftover = {
            pid: p for pid, p in _children().items() if pid not in before}
        if not leftover:
            return
        time.sleep(0.1)
    names = []
    for p in leftover.values():
        try:
            names.append(f'{p.pid}:{" ".join(p.cmdline())[:120]}')
            p.kill()
        except psutil.NoSuchProcess:
            pass
    if names:
        pytest.fail(f'Test left processes behind: {names}')
