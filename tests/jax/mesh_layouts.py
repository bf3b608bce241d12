"""Trains our DreamerV3 (`debug`, float32) for 10 updates on one fixed batch
under several train meshes, in one process with 8 mock CPU devices, and
writes what `test_mesh.py` compares to an npz file:

    python tests/jax/mesh_layouts.py OUT.npz 8,1,1 2,4,1 2,2,2 1,4,2

The reference runs on one device (device 0, mesh '1,1,1'). Every layout
starts from the reference's initial state, loaded from a checkpoint file
the reference wrote (so loading onto a mesh is exercised too). Written per
run R ('ref' or a layout):

    R/metric/<update>/<name>   every train metric after each update
    R/state/<name>             the state after 10 updates (agent.save())
    R/shards/<name>            per device of the layout, the shape of its
                               shard of each state entry, (devices, rank)
    R/spec/<name>              the entry's PartitionSpec as text
    R/policy/<name>            the policy's copy of a parameter after the
                               last update: rows (device id, *shard shape)
    ckpt/1to142/<name>         the reference's final save, loaded by the
                               '1,4,2' agent and saved again
    ckpt/222to1/<name>         the '2,2,2' agent's final save, loaded by the
                               1-device reference and saved again
"""

import pathlib
import sys

import elements
import numpy as np

UPDATES = 10
OBS = {
    'vector': elements.Space(np.float32, (4,)),
    'reward': elements.Space(np.float32),
    'is_first': elements.Space(bool),
    'is_last': elements.Space(bool),
    'is_terminal': elements.Space(bool),
}
ACT = {
    'action': elements.Space(np.int32, (), 0, 3),
    'move': elements.Space(np.float32, (2,), -1, 1),
}


def make_config(logdir, mesh, policy_mesh='-1,1,1'):
    from embodied import main as mainlib
    config = mainlib.parse([
        '--configs', 'debug', '--logdir', str(logdir),
        '--jax.mock_devices', '8', '--jax.train_mesh', mesh,
        '--jax.policy_mesh', policy_mesh,
        '--jax.compute_dtype', 'float32', '--jax.precompile', 'False',
        # Reward and value heads that start away from zero: otherwise the
        # imagined returns and advantages of the first updates are at the
        # size of float32 rounding, and the policy gradient, normalised by
        # their spread, is rounding noise that any change of summation
        # order (as sharding makes) turns into other numbers.
        '--agent.rewhead.outscale', '1.0', '--agent.value.outscale', '1.0',
        # A small learning rate keeps 10 updates free of chaos (see
        # tests/agents/test_parity_dreamerv3.py, LR).
        '--agent.opt.lr', '1e-5', '--agent.opt.warmup', '0'])
    return elements.Config(
        **config.agent, logdir=config.logdir, seed=config.seed,
        jax=config.jax, batch_size=config.batch_size,
        batch_length=config.batch_length, replay_context=config.replay_context,
        report_length=config.report_length, replica=0, replicas=1)


def make_batch(config, spaces, seed=0):
    rng = np.random.default_rng(seed)
    B = config.batch_size
    T = config.batch_length + config.replay_context
    data = {}
    for key, space in spaces.items():
        shape = (B, T, *space.shape)
        if space.dtype == bool:
            data[key] = rng.uniform(size=shape) < 0.1
        elif np.issubdtype(space.dtype, np.integer):
            high = space.high.max() if space.discrete else 255
            data[key] = rng.integers(0, int(high) + 1, shape).astype(
                space.dtype)
        else:
            data[key] = rng.normal(size=shape).astype(space.dtype)
    data['consec'] = np.repeat(
        (np.arange(B) % 2)[:, None], T, 1).astype(np.int32)
    return data


def train(agent, config, data, name, out):
    carry = agent.init_train(config.batch_size)
    for update in range(1, UPDATES + 1):
        carry, _, metrics = agent.train(carry, data)
        for key, value in metrics.items():
            out[f'{name}/metric/{update}/{key}'] = np.asarray(value)
    for key, value in agent.save().items():
        out[f'{name}/state/{key}'] = value
    for key, array in agent._state.items():
        shards = sorted(array.addressable_shards, key=lambda s: s.device.id)
        out[f'{name}/shards/{key}'] = np.array(
            [s.data.shape for s in shards], np.int64).reshape(
                len(shards), array.ndim)
        out[f'{name}/spec/{key}'] = np.array(str(array.sharding.spec))
    # The policy's copy of its parameters, as the handover left it.
    for key, array in agent._params.newest().items():
        shards = sorted(array.addressable_shards, key=lambda s: s.device.id)
        out[f'{name}/policy/{key}'] = np.array(
            [[s.device.id, *s.data.shape] for s in shards], np.int64)


def main(path, layouts):
    from embodied.agents.dreamerv3 import Agent
    from embodied.core import checkpoint
    root = pathlib.Path(path).parent / 'mesh_layouts'
    out = {}
    config = make_config(root / 'ref', '1,1,1')
    reference = Agent(OBS, ACT, config)
    data = make_batch(config, reference.spaces)
    initial = checkpoint.Checkpoint(root / 'initial')
    initial.agent = reference
    initial.save()
    train(reference, config, data, 'ref', out)
    final = checkpoint.Checkpoint(root / 'ref_final')
    final.agent = reference
    final.save()
    for layout in layouts:
        # The 2,2,2 agent acts on a mesh of its own: FSDP over devices 0-1.
        policy_mesh = '1,2,1' if layout == '2,2,2' else '-1,1,1'
        config = make_config(root / layout, layout, policy_mesh)
        agent = Agent(OBS, ACT, config)
        # Every layout starts from the reference's saved initial state.
        ckpt = checkpoint.Checkpoint(root / 'initial')
        ckpt.agent = agent
        ckpt.load()
        train(agent, config, data, layout, out)
        if layout == '1,4,2':
            ckpt = checkpoint.Checkpoint(root / 'ref_final')
            ckpt.agent = agent
            ckpt.load()
            for key, value in agent.save().items():
                out[f'ckpt/1to142/{key}'] = value
        if layout == '2,2,2':
            saved = checkpoint.Checkpoint(root / 'final_222')
            saved.agent = agent
            saved.save()
            ckpt = checkpoint.Checkpoint(root / 'final_222')
            ckpt.agent = reference
            ckpt.load()
            for key, value in reference.save().items():
                out[f'ckpt/222to1/{key}'] = value
        del agent
    np.savez(path, **out)
    print('Wrote', len(out), 'arrays to', path, flush=True)


if __name__ == '__main__':
    main(sys.argv[1], sys.argv[2:])
