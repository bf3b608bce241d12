"""Each real suite end to end: `--script parallel` with 2 envs for a few
hundred steps, then every image the replay saved is checked against a fresh
env of the same seed that replays the stored actions. The suites that other
tests train DreamerV3 on run the test agent; those that no other test
trains (pinpad, memmaze) run DreamerV3 at the debug size, so that one run
shows both: the suite trains under `--script parallel` and its images
arrive intact."""

import importlib.util
import os
import pathlib
import re

import numpy as np
import pytest

import launch
from embodied.core import chunk as chunklib

os.environ.setdefault('MUJOCO_GL', 'egl')

# DreamerV3's runs train a few updates: at the debug size an update on
# 64x64 images takes about half a second on a CPU core, and the test needs
# updates, not many (train ratio 8: one per 12 env steps of debug's 8 x 12
# batches, instead of one per 3).
FEW_UPDATES = ('--run.train_ratio', '8')
SUITES = {
    # suite: (import, flags, steps replayed exactly[, agent]); run.steps counts frames
    # (action repeat). Crafter keeps each world chunk's objects in a set, so
    # which creature it despawns depends on memory addresses and a second
    # env of the same seed may drift apart: its streams are compared on the
    # first frame, which the seed fixes (the world and its creatures).
    'atari': ('ale_py', (
        '--configs', 'atari100k', 'debug', '--run.steps', '1200',
        '--env.atari100k.use_seed', 'True', '--env.atari100k.sticky', 'True'),
        None),
    'crafter': ('crafter', (
        '--configs', 'crafter', 'debug', '--run.steps', '400',
        '--env.crafter.use_seed', 'True'), 1),
    'dmc': ('dm_control.suite', (
        '--configs', 'dmc_vision', 'debug', '--run.steps', '300',
        '--task', 'dmc_cartpole_swingup', '--env.dmc.repeat', '2',
        '--env.dmc.use_seed', 'True'), None),
    'pinpad': ('numpy', (
        '--configs', 'debug', '--task', 'pinpad_three', '--run.steps', '300',
        '--env.pinpad.length', '60', '--env.pinpad.use_seed', 'True',
        *FEW_UPDATES), None, 'dreamerv3'),
    'memmaze': ('memory_maze', (
        '--configs', 'debug', '--task', 'memmaze_9x9', '--run.steps', '200',
        '--env.memmaze.use_seed', 'True', *FEW_UPDATES), None, 'dreamerv3'),
    'loconav': ('dm_control.suite', (
        '--configs', 'loconav', 'debug', '--run.steps', '200',
        '--env.loconav.use_seed', 'True', *FEW_UPDATES), None, 'dreamerv3'),
    # procgen-gym installs on Python >= 3.13 only: not in CI (3.11).
    'procgen': ('procgen_gym', (
        '--configs', 'procgen', 'debug', '--run.steps', '300',
        '--env.procgen.use_seed', 'True'), None),
}
# The image the agent sees, where it is not `image`.
IMAGE_KEYS = {'loconav': 'walker_egocentric_camera'}
COMMON = (
    '--script', 'parallel', '--run.envs', '2',
    '--run.eval_envs', '0', '--replay.size', '3000', '--logger.outputs',
    'jsonl', '--run.log_every', '2', '--run.report_every', '1e9')


def replay_streams(folder):
    """The steps the replay saved, one dict of arrays per env, in order:
    chunk files are linked to their successors by name."""
    chunks = {}
    for path in pathlib.Path(folder).glob('*.npz'):
        chunk = chunklib.Chunk.read(path)
        chunks[chunk.uuid] = chunk
    successors = {c.succ for c in chunks.values()}
    streams = []
    for head in chunks.values():
        if head.uuid in successors:
            continue
        parts, current = [], head
        while current is not None:
            parts.append(current.data)
            current = chunks.get(current.succ)
        streams.append({
            key: np.concatenate([part[key] for part in parts])
            for key in parts[0]})
    return streams


def replay_in_env(config, stream, indices, steps=None, key='image'):
    """Steps a fresh env with the stream's actions and compares every frame;
    returns the env index that reproduces the stream (envs may share their
    first frames, so each index is tried on the whole stream). `steps`
    limits the comparison to the first steps."""
    from embodied import main
    assert stream['is_first'][0]
    errors = []
    for index in indices:
        env = main.make_env(config, index)
        try:
            obs = env.step({'action': stream['action'][0], 'reset': True})
            np.testing.assert_array_equal(obs[key], stream[key][0])
            for t in range(1, min(len(stream[key]), steps or 10 ** 9)):
                obs = env.step({'action': stream['action'][t - 1],
                                'reset': stream['is_last'][t - 1]})
                np.testing.assert_array_equal(
                    obs[key], stream[key][t], err_msg=f'step {t}')
                assert obs['is_first'] == stream['is_first'][t], t
                assert obs['reward'] == stream['reward'][t], t
            return index
        except AssertionError as e:
            errors.append(f'env {index}: {str(e)[:500]}')
        finally:
            env.close()
    raise AssertionError('no env reproduces the stream:\n' + '\n'.join(errors))


@pytest.mark.slow
@pytest.mark.parametrize('suite', sorted(SUITES))
def test_parallel_run_keeps_images_intact(suite, tmp_path):
    module, flags, steps, agent = (*SUITES[suite], 'testing')[:4]
    # find_spec, not an import: memory-maze's own import needs the old gym.
    if importlib.util.find_spec(module.split('.')[0]) is None:
        pytest.skip(f'{module} is not installed')
    logdir = tmp_path / 'run'
    flags = (*COMMON, '--agent_impl', agent, *flags, '--logdir', logdir)
    result = launch.run(*flags, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:]
    assert 'All workers exited' in result.stdout
    if agent == 'dreamerv3':
        assert 'Compiled the agent in' in result.stdout, result.stdout[-4000:]
        assert 'Agent: tracing' not in result.stdout, result.stdout[-4000:]

    from embodied import main
    config = main.parse([*map(str, flags)])
    key = IMAGE_KEYS.get(suite, 'image')
    env = main.make_env(config, 0)
    space = env.obs_space[key]
    env.close()
    streams = replay_streams(logdir / 'replay')
    assert len(streams) == 2
    found = set()
    for stream in streams:
        assert stream[key].shape[1:] == space.shape
        assert stream[key].dtype == np.uint8
        assert len(stream[key]) >= 50
        assert not [k for k in stream if k.startswith('log/')]
        found.add(replay_in_env(config, stream, range(2), steps, key))
    assert found == {0, 1}
    # The learner trained on batches of these images (DreamerV3 may reach
    # run.steps while its train step still compiles).
    line = re.findall(r'\[Summary\] (.*)', result.stdout)[-1]
    numbers = dict(x.split('=') for x in line.split())
    if agent == 'testing':
        assert float(numbers['train_steps']) > 0, line


def test_suite_modules_import_without_their_packages():
    launch.assert_imports_without(
        ['embodied.envs.atari', 'embodied.envs.crafter', 'embodied.envs.dmc',
         'embodied.envs.pinpad', 'embodied.envs.bsuite',
         'embodied.envs.memmaze', 'embodied.envs.loconav',
         'embodied.envs.procgen', 'embodied.envs.dmlab',
         'embodied.envs.minecraft', 'embodied.main'],
        ['ale_py', 'crafter', 'dm_control', 'mujoco', 'cv2', 'PIL', 'bsuite',
         'memory_maze', 'labmaze', 'procgen_gym', 'gymnasium',
         'deepmind_lab', 'minerl'])


def test_unknown_suite_names_the_real_ones():
    result = launch.run('--task', 'atary_pong', '--logdir', '/tmp/unused')
    assert result.returncode == 2
    assert "Unknown --task 'atary_pong'" in result.stdout
    assert 'atari' in result.stdout and 'dmc' in result.stdout


# DreamerV3 on each suite block: tests/test_user_paths.py::test_suite_trains.
