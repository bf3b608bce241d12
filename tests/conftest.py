"""Shared test setup: CPU JAX, no process of a test left behind, the
fixtures that pin the compute dtype of `embodied.jax.nets`, and
`tests/support` on the path for the shared helpers (`import helpers`,
`import launch`, `from fixtures.compat_agent import ...`).

One JAX compilation cache serves the whole run, xdist workers and the
commands the tests launch included: a folder made for the run (never the
user's own cache), removed at its end. Set $EMBODIED_TEST_JAX_CACHE to keep
one across runs while working on the code. Tests of cold behaviour (cache
misses, a first launch, compile-time messages) set $EMBODIED_JAX_CACHE of
their commands to a folder of their own under `tmp_path`.

Every test folder is a package under `tests`, so a folder such as
`tests/jax` imports as `tests.jax` and cannot shadow the library it tests."""

import os
import pathlib
import shutil
import sys
import tempfile
import time

os.environ.setdefault('JAX_PLATFORMS', 'cpu')
os.environ.setdefault('PYTHONUNBUFFERED', '1')
# The suite starts hundreds of Python processes (launches and their
# workers) from this checkout; where $PYTHONDONTWRITEBYTECODE is set (as on
# the development machine) each compiles the package's sources anew, a
# quarter of a worker's start (0.12 of 0.48 CPU-s).
os.environ.pop('PYTHONDONTWRITEBYTECODE', None)
sys.dont_write_bytecode = False

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


_RUN_CACHE = 'EMBODIED_TEST_RUN_JAX_CACHE'  # set by the controller for workers


def pytest_configure(config):
    """Points $EMBODIED_JAX_CACHE at the run's folder. The controller (or a
    run without xdist) makes it before the workers start; they inherit it.
    xdist hands tests out two at a time (`_schedule_in_small_chunks`)."""
    config.addinivalue_line(
        'markers', 'slow: launches DreamerV3 or a whole run for longer than '
        'the quick tier allows (`-m "not slow"` leaves these out)')
    folder = os.environ.get(_RUN_CACHE)
    if not folder:
        folder = os.environ.get('EMBODIED_TEST_JAX_CACHE') or tempfile.mkdtemp(
            prefix='embodied-test-jaxcache-')
        os.environ[_RUN_CACHE] = folder
        config._embodied_made_cache = (
            folder if 'EMBODIED_TEST_JAX_CACHE' not in os.environ else None)
    os.environ['EMBODIED_JAX_CACHE'] = folder
    _schedule_in_small_chunks(config)


# The suite's longest files (minutes each on two cores), started first.
LONGEST_FIRST = (
    'tests/run/test_replica_stop.py', 'tests/perf/test_perf_gpu_check.py',
    'tests/jax/test_mesh.py', 'tests/devtools/test_soak.py',
    'tests/test_slurm.py', 'tests/run/test_replicas.py',
    'tests/run/test_replicas_hosts.py',
    'tests/run/parallel/test_env_suites_parallel.py',
    'tests/envs/test_env_bsuite.py',
    'tests/run/parallel/test_policy_role.py',
    'tests/run/test_out_of_memory.py', 'tests/test_policy_page.py',
    'tests/test_reproduce.py', 'tests/sweep/test_sweep.py',
    'tests/test_original_tests.py')


def pytest_collection_modifyitems(config, items):
    """Runs the `slow` tests first, the longest files among them first, and
    the short tests last: with xdist's workers handed two tests at a time
    (`_schedule_in_small_chunks`), the short ones fill in while the long
    ones run, and no worker waits at the end for the other's long test."""
    def rank(item):
        path = item.nodeid.split('::')[0]
        if path in LONGEST_FIRST:
            return LONGEST_FIRST.index(path)
        return len(LONGEST_FIRST) + (0 if item.get_closest_marker('slow') else 1)
    items[:] = sorted(items, key=rank)  # Stable: a file keeps its order.


def _schedule_in_small_chunks(config):
    # xdist's `load` scheduler first hands each worker a quarter of its
    # share in one consecutive chunk, which with the slow tests first would
    # give one worker all of them; `--maxschedchunk` caps every hand-out.
    option = config.option
    if getattr(option, 'maxschedchunk', 0) is None:
        option.maxschedchunk = 2


def pytest_unconfigure(config):
    folder = getattr(config, '_embodied_made_cache', None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


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
