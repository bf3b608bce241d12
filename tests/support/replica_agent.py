"""Trains the default DreamerV3 agent at `debug` on fixed batches as one of
`replicas` processes, and writes its parameters; for the test that a run of
2 processes x 2 devices equals one of 1 process x 4 devices.

    python replica_agent.py REPLICA REPLICAS PORT DEVICES OUT [UPDATES]

Every process feeds its rows of the same global batches of 4 rows (replica
r rows [r * 4 / replicas, ...)); at the end it prints updates per second
over the updates after the first and writes `agent.save()` to OUT (.npz).
"""

import sys
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


def main():
    replica, replicas, port, devices, out = sys.argv[1:6]
    updates = int(sys.argv[6]) if len(sys.argv) > 6 else 3
    replica, replicas, devices = int(replica), int(replicas), int(devices)
    import os
    from embodied import main as mainlib
    local = GLOBAL_BATCH // replicas
    flags = [
        '--configs', 'debug', '--task', 'dummy_disc', '--logdir',
        os.path.join(os.path.dirname(out), f'logdir{replicas}'),
        '--batch_size', str(local), '--batch_length', '8',
        '--report_length', '4', '--run.envs', '2', '--run.eval_envs', '0',
        '--jax.mock_devices', str(devices), '--jax.train_devices',
        *[str(i) for i in range(devices)], '--jax.precompile', 'False']
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
    print('done', flush=True)


if __name__ == '__main__':
    main()
