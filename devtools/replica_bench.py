"""Replicas on one machine: learner updates/s of 2 processes x 2 CPU
devices against 1 process x 4, and the seconds until a replica exits after
another was killed.

    python -m devtools.replica_bench [--updates 20]

Prints a table. `updates/s` trains the default DreamerV3 agent at `debug` on
fixed global batches of 4 rows (`--worker`, below), in fresh processes on
loopback (gloo collectives), over the updates after the first (which
compiles). `exit after kill s` starts `--script train` as two replicas,
SIGKILLs replica 1 once both train, and times replica 0's exit.

    python -m devtools.replica_bench --worker REPLICA REPLICAS PORT DEVICES OUT [UPDATES [TASK]]

is one process of such a run: it feeds its rows of the global batches
(replica r rows [r * 4 / replicas, ...)), prints `updates/s`, and writes
`agent.save()` to OUT (.npz); `tests/run/test_replicas.py` compares those
of 2 x 2 and 1 x 4. TASK (default dummy_disc, with its 64x64 image) gives
the spaces of the batches.
"""

import argparse
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

GLOBAL_BATCH = 4


def batches(spaces, length, count):
    rng = np.random.default_rng(0)
    for _ in range(count):
        batch = {}
        for key, space in spaces.items():
            shape = (GLOBAL_BATCH, length, *space.shape)
            if space.discrete:
                low = np.broadcast_to(space.low, space.shape)
                high = np.broadcast_to(space.high, space.shape)
                value = rng.integers(low, high, shape)
            else:
                value = rng.uniform(-1, 1, shape)
            if key.startswith('is_'):
                value = np.zeros(shape, bool)
            batch[key] = value.astype(space.dtype)
        yield batch


def worker(argv):
    replica, replicas, port, devices, out = argv[:5]
    updates = int(argv[5]) if len(argv) > 5 else 3
    task = argv[6] if len(argv) > 6 else 'dummy_disc'
    replica, replicas, devices = int(replica), int(replicas), int(devices)
    from embodied import main as mainlib
    local = GLOBAL_BATCH // replicas
    flags = [
        '--configs', 'debug', '--task', task, '--logdir',
        os.path.join(os.path.dirname(out), f'logdir{replicas}'),
        '--batch_size', str(local), '--batch_length', '8',
        '--report_length', '4', '--run.envs', '2', '--run.eval_envs', '0',
        '--jax.mock_devices', str(devices), '--jax.train_devices',
        *[str(i) for i in range(devices)],
        # Only train runs here: it compiles at the first update.
        '--jax.precompile', 'False']
    if replicas > 1:
        flags += [
            '--replica', str(replica), '--replicas', str(replicas),
            '--jax.coordinator_address', f'127.0.0.1:{port}']
    config = mainlib.parse(flags)
    agent = mainlib.make_agent(config)
    length = config.batch_length + config.replay_context
    rows = slice(replica * local, (replica + 1) * local)
    carry = agent.init_train(local)
    start = None
    for index, batch in enumerate(batches(agent.spaces, length, updates)):
        batch = {k: v[rows] for k, v in batch.items()}
        carry, _, metrics = agent.train(carry, batch)
        dict(metrics)  # Waits for the update.
        if index == 0:
            start = time.monotonic()
    if updates > 1:
        rate = (updates - 1) / (time.monotonic() - start)
        print(f'updates/s {rate:.3f} ({replicas} x {devices} devices)',
              flush=True)
    np.savez(out, **agent.save())
    from embodied.jax import distributed
    distributed.finish()  # Replica 0, the coordinator, leaves last.
    print('done', flush=True)


def free_port():
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def _env():
    env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONUNBUFFERED='1')
    root = str(pathlib.Path(__file__).resolve().parents[1])
    env['PYTHONPATH'] = os.pathsep.join([root, env.get('PYTHONPATH', '')])
    return env


def _spawn(argv, log):
    return subprocess.Popen(
        [sys.executable, *map(str, argv)], env=_env(), stdout=open(log, 'w'),
        stderr=subprocess.STDOUT)


def updates_per_second(tmp, replicas, devices, updates):
    port = free_port()
    procs = [_spawn(
        ['-m', 'devtools.replica_bench', '--worker', replica, replicas,
         port, devices, tmp / f'{replicas}x{devices}-{replica}.npz', updates],
        tmp / f'{replicas}x{devices}-{replica}.log')
        for replica in range(replicas)]
    for proc in procs:
        proc.wait(1800)
    text = (tmp / f'{replicas}x{devices}-0.log').read_text()
    found = re.findall(r'updates/s ([0-9.]+)', text)
    if not found:
        raise RuntimeError(f'{replicas} x {devices} failed:\n{text[-2000:]}')
    return float(found[-1])


def seconds_to_exit_after_kill(tmp):
    port = free_port()
    flags = [
        '-m', 'embodied.main', '--configs', 'debug', '--task', 'dummy_disc',
        '--logdir', tmp / 'kill', '--replicas', 2, '--jax.coordinator_address',
        f'127.0.0.1:{port}', '--jax.mock_devices', 2, '--jax.train_devices',
        0, 1, '--run.envs', 2, '--run.eval_envs', 0, '--batch_size', 4,
        '--batch_length', 8, '--report_length', 4, '--run.steps', 1e6]
    logs = [tmp / f'kill{i}.log' for i in range(2)]
    procs = [_spawn(flags + ['--replica', i], logs[i]) for i in range(2)]
    try:
        deadline = time.monotonic() + 1800
        while not all('Start training loop' in log.read_text() for log in logs):
            if time.monotonic() > deadline or any(
                    p.poll() is not None for p in procs):
                raise RuntimeError('The replicas did not start training.')
            time.sleep(0.2)
        time.sleep(5)
        procs[1].send_signal(signal.SIGKILL)
        begin = time.monotonic()
        code = procs[0].wait(300)
        return time.monotonic() - begin, code
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def main():
    if sys.argv[1:2] == ['--worker']:
        return worker(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--updates', type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        one = updates_per_second(tmp, 1, 4, args.updates)
        two = updates_per_second(tmp, 2, 2, args.updates)
        seconds, code = seconds_to_exit_after_kill(tmp)
    print('| run | updates/s |')
    print('|---|---|')
    print(f'| 1 process x 4 CPU devices | {one:.3f} |')
    print(f'| 2 processes x 2 CPU devices | {two:.3f} |')
    print()
    print(f'Replica 0 exited {seconds:.1f} s after replica 1 was killed '
          f'(exit code {code}).')


if __name__ == '__main__':
    main()
