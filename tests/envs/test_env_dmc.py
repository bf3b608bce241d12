"""The DeepMind Control adapter: images and vectors against dm_control
directly, headless rendering, and the original's config blocks."""

import os
import subprocess
import sys

import numpy as np
import pytest

os.environ.setdefault('MUJOCO_GL', 'egl')
pytest.importorskip('dm_control.suite')

from dm_control import suite  # noqa: E402

from embodied.core.wrappers import check_values  # noqa: E402
from embodied.envs.dmc import DMC  # noqa: E402


def reset(env):
    return env.step({'action': np.zeros(env.act_space['action'].shape,
                                        np.float32), 'reset': True})


def act(env, action):
    return env.step({'action': np.float32(action), 'reset': False})


def test_spaces_and_fifty_steps_match_dm_control():
    env = DMC('walker_walk', size=(48, 80), seed=4)
    direct = suite.load('walker', 'walk', task_kwargs={'random': 4})
    spec = direct.observation_spec()
    assert env.obs_space['image'].shape == (48, 80, 3)
    assert env.obs_space['image'].dtype == np.uint8
    for key in spec:
        assert env.obs_space[key].shape == spec[key].shape
        assert env.obs_space[key].dtype == np.float32
    assert env.act_space['action'].shape == (6,)
    obs = reset(env)
    direct.reset()
    np.testing.assert_array_equal(
        obs['image'], direct.physics.render(48, 80, camera_id=0))
    rng = np.random.default_rng(0)
    for _ in range(50):
        check_values('obs', obs, env.obs_space)
        assert set(obs) == set(env.obs_space)
        action = rng.uniform(-1, 1, 6).astype(np.float32)
        obs = act(env, action)
        step = direct.step(action)
        assert obs['reward'] == np.float32(step.reward)
        np.testing.assert_allclose(obs['orientations'],
                                   step.observation['orientations'])
        np.testing.assert_array_equal(
            obs['image'], direct.physics.render(48, 80, camera_id=0))
    assert obs['image'].std() > 0


def test_repeat_sums_rewards_and_shows_the_last_frame():
    env = DMC('cartpole_swingup', repeat=3, seed=1)
    direct = suite.load('cartpole', 'swingup', task_kwargs={'random': 1})
    reset(env)
    direct.reset()
    for value in [1.0, 1.0, -1.0, 0.5, -0.3] * 4:
        obs = act(env, [value])
        rewards = [direct.step([value]).reward for _ in range(3)]
        assert obs['reward'] == pytest.approx(sum(rewards), rel=1e-6)
        np.testing.assert_array_equal(
            obs['image'], direct.physics.render(64, 64, camera_id=0))


def test_episode_ends_after_the_time_limit():
    env = DMC('cartpole_balance', repeat=4, size=(16, 16), seed=0)
    obs = reset(env)
    steps = 0
    while not obs['is_last']:
        obs = act(env, [0.0])
        steps += 1
    assert steps == 250  # 1000 control steps.
    assert not obs['is_terminal']
    assert reset(env)['is_first']


def test_vision_only_and_proprio_only():
    vision = DMC('cartpole_balance', proprio=False, seed=0)
    assert set(vision.obs_space) == {
        'image', 'reward', 'is_first', 'is_last', 'is_terminal'}
    assert set(reset(vision)) == set(vision.obs_space)
    proprio = DMC('cartpole_balance', image=False, seed=0)
    assert 'image' not in proprio.obs_space
    assert proprio.obs_space['log/image'].shape == (64, 64, 3)
    assert {'position', 'velocity'} <= set(proprio.obs_space)
    obs = reset(proprio)
    assert obs['log/image'].shape == (64, 64, 3)


def test_default_camera_per_domain():
    env = DMC('quadruped_walk', size=(32, 32), seed=2)
    direct = suite.load('quadruped', 'walk', task_kwargs={'random': 2})
    obs = reset(env)
    direct.reset()
    np.testing.assert_array_equal(
        obs['image'], direct.physics.render(32, 32, camera_id=2))
    assert not np.array_equal(
        obs['image'], direct.physics.render(32, 32, camera_id=0))
    env = DMC('cup_catch', camera=1, size=(32, 32), seed=2)
    direct = suite.load('ball_in_cup', 'catch', task_kwargs={'random': 2})
    obs = reset(env)
    direct.reset()
    np.testing.assert_array_equal(
        obs['image'], direct.physics.render(32, 32, camera_id=1))


def test_renders_headless_with_egl_by_default():
    code = (
        'import os; os.environ.pop("MUJOCO_GL", None); import numpy as np; '
        'from embodied.envs.dmc import DMC; '
        'env = DMC("cartpole_balance", size=(8, 8)); '
        'obs = env.step({"action": np.zeros(1, np.float32), "reset": True}); '
        'assert obs["image"].std() > 0; print(os.environ["MUJOCO_GL"])')
    environ = {k: v for k, v in os.environ.items() if k != 'MUJOCO_GL'}
    environ.pop('DISPLAY', None)
    result = subprocess.run(
        [sys.executable, '-c', code], capture_output=True, text=True,
        timeout=120, env=environ)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ['egl']


def test_non_finite_action_is_refused():
    env = DMC('cartpole_balance', size=(8, 8), seed=0)
    reset(env)
    with pytest.raises(ValueError, match="action 'action' is not finite"):
        act(env, [np.nan])


def test_unknown_task_suggests_close_names():
    with pytest.raises(ValueError, match='walker_walk'):
        DMC('walker_wlak')


def test_config_blocks_select_image_or_vectors(tmp_path):
    from embodied import main
    vision = main.parse([
        '--configs', 'dmc_vision', '--logdir', str(tmp_path)])
    assert vision.task == 'dmc_walker_walk'
    agent = main.make_agent(vision.update(agent_impl='testing'))
    assert set(agent.obs_space) == {
        'image', 'reward', 'is_first', 'is_last', 'is_terminal'}
    assert agent.act_space['action'].shape == (6,)
    assert (agent.act_space['action'].low == -1).all()
    assert (agent.act_space['action'].high == 1).all()
    proprio = main.parse([
        '--configs', 'dmc_proprio', '--logdir', str(tmp_path)])
    assert proprio.agent.dyn.rssm.deter == 512  # size1m
    agent = main.make_agent(proprio.update(agent_impl='testing'))
    assert 'image' not in agent.obs_space
    assert 'log/image' not in agent.obs_space
    assert 'orientations' in agent.obs_space


def test_log_image_reaches_the_logger_as_a_video():
    from embodied.run.episodes import EpisodeStats
    env = DMC('cartpole_balance', image=False, repeat=50, size=(16, 16),
              seed=0)
    stats = EpisodeStats(logger=type('Logger', (), {
        'add': lambda self, metrics, prefix=None: None})())
    frames = []
    obs = reset(env)
    while True:
        frames.append(obs['log/image'])
        stats.add(obs)
        if obs['is_last']:
            break
        obs = act(env, [0.0])
    video = stats.result()['policy_log/image']
    np.testing.assert_array_equal(video, np.stack(frames))
    assert len(frames) == 21  # 1000 control steps at repeat 50, and reset.
    with pytest.raises(ValueError, match="'log/bad' must be a scalar"):
        stats.add({**obs, 'is_first': True,
                   'log/bad': np.zeros(3, np.float32)})
