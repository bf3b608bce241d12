"""LocoNav: the mazes, the quadruped walker against the suite's quadruped
(and, with EMBODIED_ORIGINAL_DREAMERV3, against the original's model), the
goal's reward with and without `again`, coverage and the task names."""

import os
import pathlib

import numpy as np
import pytest

os.environ.setdefault('MUJOCO_GL', 'egl')
pytest.importorskip('dm_control.suite')

from embodied.core.wrappers import check_values  # noqa: E402
from embodied.envs import loconav  # noqa: E402
from embodied.envs import loconav_mazes  # noqa: E402

ORIGINAL = os.environ.get('EMBODIED_ORIGINAL_DREAMERV3', '')


@pytest.mark.parametrize('name', sorted(loconav_mazes.MAPS))
def test_mazes_are_square_with_one_spawn_and_goal(name):
    rows = loconav_mazes.entity_layer(name).splitlines()
    assert len({len(row) for row in rows}) == 1
    text = ''.join(rows)
    if name != 'empty':
        assert text.count('P') == 1 and text.count('G') == 1
    assert set(text) <= set(' *PG123456789')


def test_task_names_and_rates():
    assert loconav._rate('ant_maze_m') == ('ant_maze_m', 50)
    assert loconav._rate('ant_maze_m_10hz') == ('ant_maze_m', 10)
    with pytest.raises(ValueError, match="Unknown LocoNav task 'dog_maze_m'"):
        loconav.LocoNav('dog_maze_m')
    with pytest.raises(ValueError, match='maze_xxl'):
        loconav.LocoNav('ant_maze_q')


def model_counts(physics):
    names = ('nq', 'nv', 'nu', 'na', 'nbody', 'ngeom', 'ncam', 'nsensor',
             'nsite', 'nlight', 'nmat', 'ntex')
    return {n: int(getattr(physics.model, n)) for n in names}


def test_quadruped_is_the_suites_without_the_arena():
    from dm_control import mjcf
    from dm_control import suite
    from embodied.envs import loconav_quadruped
    walker = mjcf.Physics.from_mjcf_model(loconav_quadruped.walker_model())
    full = suite.load('quadruped', 'walk').physics
    ours, theirs = model_counts(walker), model_counts(full)
    # The suite's walk task (no ball) has a free root joint as well: 7 of
    # qpos, 6 of qvel.
    assert ours['nq'] == theirs['nq'] - 7
    assert ours['nv'] == theirs['nv'] - 6
    assert ours['nu'] == theirs['nu'] == 12
    names = [walker.model.id2name(i, 'camera') for i in range(5)]
    assert names == ['sideon', 'float_far', 'x', 'y', 'egocentric']


@pytest.mark.skipif(not ORIGINAL, reason='EMBODIED_ORIGINAL_DREAMERV3 is not set')
def test_quadruped_is_the_originals_model():
    from dm_control import mjcf
    from embodied.envs import loconav_quadruped
    path = pathlib.Path(ORIGINAL) / 'embodied/envs/loconav_quadruped.xml'
    if not path.exists():
        pytest.skip(f'{path} does not exist')
    ours = mjcf.Physics.from_mjcf_model(loconav_quadruped.walker_model())
    theirs = mjcf.Physics.from_mjcf_model(mjcf.from_path(str(path)))
    assert model_counts(ours) == model_counts(theirs)
    for name in ('actuator_ctrlrange', 'body_mass', 'geom_size', 'cam_pos',
                 'jnt_range', 'actuator_gear'):
        np.testing.assert_allclose(
            getattr(ours.model, name), getattr(theirs.model, name))


def reach_goal(env):
    """Puts the walker on the goal sphere."""
    task = env._env._dmenv.task
    physics = env._env._dmenv.physics
    position = np.array(task._target_position, float)
    env._walker.set_pose(physics, position=position + [0, 0, 0.5])


def step(env, reset=False):
    shape = env.act_space['action'].shape
    return env.step({'action': np.zeros(shape, np.float32), 'reset': reset})


@pytest.fixture(scope='module')
def ant():
    env = loconav.LocoNav('ant_maze_s', seed=0)
    yield env
    env.close()


def test_spaces_and_coverage(ant):
    obs = step(ant, reset=True)
    check_values('obs', obs, ant.obs_space)
    assert ant.obs_space['walker_egocentric_camera'].shape == (64, 64, 3)
    assert ant.obs_space['log/image'].shape == (64, 64, 3)
    assert ant.act_space['action'].shape == (8,)
    assert obs['log/coverage'] == 1
    physics = ant._env._dmenv.physics
    start = ant._walker.get_pose(physics)[0]
    ant._walker.set_pose(physics, position=np.array(start) + [2.2, 0, 0])
    assert step(ant)['log/coverage'] == 2


def test_the_goal_rewards_every_step_after_it_is_reached(ant):
    step(ant, reset=True)
    assert step(ant)['reward'] == 0
    reach_goal(ant)
    rewards = [step(ant)['reward'] for _ in range(5)]
    assert rewards[0] == 1
    # Without `again` the walker stays and the goal stays activated.
    ant._walker.set_pose(ant._env._dmenv.physics, position=[0, 0, 0.5])
    assert [step(ant)['reward'] for _ in range(3)] == [1, 1, 1]


def test_with_again_each_reach_respawns():
    env = loconav.LocoNav('ant_maze_s', again=True, seed=0)
    step(env, reset=True)
    reach_goal(env)
    assert step(env)['reward'] == 1
    physics = env._env._dmenv.physics
    position = env._walker.get_pose(physics)[0]
    goal = np.array(env._env._dmenv.task._target_position)
    assert np.linalg.norm(np.array(position)[:2] - goal[:2]) > 1.2
    assert step(env)['reward'] == 0
    env.close()
