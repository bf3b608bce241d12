"""The persistent compilation cache with replicas: every replica, not only
replica 0, keeps what it compiles, so a relaunch of the run loads its
programs on every replica (JAX itself writes only process 0's)."""

import json
import os
import socket
import subprocess
import sys

import pytest

import launch

# One replica: joins the run, compiles a program over every replica's
# devices and one on its own device, and prints how many came cached.
SCRIPT = '''
import json, sys
import jax, numpy as np
from embodied import main
from embodied.jax import distributed, runtime
replica, port = int(sys.argv[1]), sys.argv[2]
config = main.parse([
    '--configs', 'debug', '--logdir', sys.argv[3], '--replicas', '2',
    '--replica', str(replica), '--jax.coordinator_address',
    f'127.0.0.1:{port}', '--jax.mock_devices', '2'])
distributed.start(config)
events = []
jax.monitoring.register_event_listener(lambda name, **kw: events.append(name))
runtime.setup(config.jax, config.logdir)
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
sharding = NamedSharding(Mesh(np.array(jax.devices()), ('d',)), P('d'))
x = jax.make_array_from_callback(
    (8,), sharding, lambda index: np.arange(8, dtype=np.float32)[index])
total = jax.jit(lambda x: (x * 2.5 + 7.0).sum(), in_shardings=sharding)(x)
local = jax.jit(lambda x: x * 3.5 - 1.0)(np.ones(3, np.float32))
print('RESULT', json.dumps({
    'total': float(total), 'local': local.tolist(),
    'hits': events.count('/jax/compilation_cache/cache_hits'),
    'requests': events.count(
        '/jax/compilation_cache/compile_requests_use_cache')}), flush=True)
distributed.finish(60)
'''


def free_port():
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def launch_replicas(tmp_path, cache):
    env = dict(launch.env(), EMBODIED_JAX_CACHE=str(cache))
    port = str(free_port())
    procs = [subprocess.Popen(
        [sys.executable, '-c', SCRIPT, str(replica), port,
         str(tmp_path / 'run')], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True) for replica in range(2)]
    results = []
    try:
        for proc in procs:
            output, _ = proc.communicate(timeout=300)
            assert proc.returncode == 0, output[-3000:]
            line = [x for x in output.splitlines() if x.startswith('RESULT')]
            assert line, output[-3000:]
            results.append(json.loads(line[-1].split(' ', 1)[1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


@pytest.mark.slow
def test_every_replica_loads_its_programs_on_a_relaunch(tmp_path):
    cache = tmp_path / 'cache'
    first = launch_replicas(tmp_path, cache)
    for result in first:
        assert result['total'] == 2.5 * 28 + 7.0 * 8
        assert result['local'] == [2.5] * 3
        assert result['requests'] >= 2 and result['hits'] == 0, result
    # Both replicas wrote their own entries of both programs.
    names = [p.name for p in cache.iterdir() if p.name.endswith('-cache')]
    assert sum(name.startswith('jit__lambda') for name in names) == 4, names
    again = launch_replicas(tmp_path, cache)
    for result, before in zip(again, first):
        assert result['hits'] == result['requests'] == before['requests'], (
            result, before)
        assert result['total'] == before['total']
        assert result['local'] == before['local']
