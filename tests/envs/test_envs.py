import elements
import numpy as np
import pytest

import launch
from embodied.envs import dummy
from embodied.envs.dummy import Dummy


def check_in_spaces(env, obs):
    assert set(obs) == set(env.obs_space)
    for key, space in env.obs_space.items():
        assert obs[key] in space, (key, obs[key], space)


# Dummy


@pytest.mark.parametrize('task', ['disc', 'cont'])
def test_dummy_spaces_and_obs_within_them(task):
    env = Dummy(task, size=(8, 6), length=5)
    assert env.obs_space['image'].shape == (8, 6, 3)
    assert env.obs_space['image'].dtype == np.uint8
    assert env.obs_space['count'].dtype == np.float32
    # The original's keys, dtypes and shapes; every integer one bounded.
    original = {
        'image': (np.uint8, (8, 6, 3)), 'vector': (np.float32, (7,)),
        'token': (np.int32, ()), 'count': (np.float32, ()),
        'float2d': (np.float32, (4, 5)), 'int2d': (np.int32, (2, 3)),
        'reward': (np.float32, ()), 'is_first': (bool, ()),
        'is_last': (bool, ()), 'is_terminal': (bool, ())}
    agent_keys = {k for k in env.obs_space if not k.startswith('log/')}
    assert agent_keys == set(original)
    for key, (dtype, shape) in original.items():
        space = env.obs_space[key]
        assert (space.dtype, space.shape) == (np.dtype(dtype), shape), key
        if np.issubdtype(space.dtype, np.integer):
            assert np.all(space.high < 1000), key
    assert set(env.act_space) == {'action', 'reset'}
    action = env.act_space['action']
    if task == 'disc':
        assert action.dtype == np.int32 and action.shape == ()
        assert action.discrete and action.classes > 1
    else:
        assert action.dtype == np.float32 and action.shape == (2,)
        assert (action.low == -1).all() and (action.high == 1).all()
    obs = env.step({'action': action.sample(), 'reset': True})
    check_in_spaces(env, obs)
    for _ in range(12):
        obs = env.step({'action': action.sample(), 'reset': False})
        check_in_spaces(env, obs)
    logs = [key for key in env.obs_space if key.startswith('log/')]
    assert logs and all(env.obs_space[key].shape == () for key in logs)


def test_dummy_episode_length_and_flags():
    env = Dummy('disc', size=(4, 4), length=3)
    obs = env.step({'action': 0, 'reset': True})
    assert obs['is_first'] and obs['reward'] == 0
    flags = []
    for _ in range(7):
        obs = env.step({'action': 1, 'reset': False})
        flags.append((
            bool(obs['is_first']), bool(obs['is_last']), float(obs['reward'])))
        assert not obs['is_terminal']
    # Three steps, then the is_last one restarts on the next step by itself.
    assert flags == [
        (False, False, 1.0), (False, False, 1.0), (False, True, 1.0),
        (True, False, 0.0),
        (False, False, 1.0), (False, False, 1.0), (False, True, 1.0)]


def test_dummy_count_continues_across_episodes_and_resets():
    env = Dummy('cont', size=(5, 7), length=4)
    counts = []
    for index in range(15):
        reset = index in (0, 6)  # A forced reset in the middle of an episode.
        obs = env.step({'action': np.zeros(2, np.float32), 'reset': reset})
        counts.append(int(obs['count']))
        np.testing.assert_array_equal(
            obs['image'], dummy.image_for(obs['count'], (5, 7)))
        np.testing.assert_array_equal(
            obs['vector'], dummy.vector_for(obs['count']))
        assert bool(obs['is_first']) == (index in (0, 5, 6, 11))
    assert counts == list(range(15))


def test_dummy_content_functions_are_distinct_and_vectorised():
    counts = np.arange(6).reshape(2, 3)
    images = dummy.image_for(counts, (4, 5))
    vectors = dummy.vector_for(counts)
    assert images.shape == (2, 3, 4, 5, 3) and images.dtype == np.uint8
    assert vectors.shape == (2, 3, dummy.VECTOR_SIZE)
    np.testing.assert_array_equal(images[1, 2], dummy.image_for(5, (4, 5)))
    np.testing.assert_array_equal(vectors[1, 2], dummy.vector_for(5))
    flat = vectors.reshape(6, -1)
    assert len({row.tobytes() for row in flat}) == 6
    # A transposed image is not the image of the same count.
    square = dummy.image_for(3, (4, 4))
    assert not np.array_equal(square, square.transpose(1, 0, 2))


def test_dummy_log_player_pos_follows_actions():
    env = Dummy('disc', size=(4, 4), length=10)
    env.step({'action': 0, 'reset': True})
    moved = [
        float(env.step({'action': 3, 'reset': False})['log/player_pos'])
        for _ in range(3)]
    assert moved == [1.5, 3.0, 4.5]


def test_dummy_bad_input():
    with pytest.raises(ValueError, match="Unknown Dummy task 'foo'"):
        Dummy('foo')
    with pytest.raises(ValueError, match='size'):
        Dummy('disc', size=(0, 4))
    with pytest.raises(ValueError, match='length'):
        Dummy('disc', length=0)
    env = Dummy('disc', size=(4, 4))
    env.step({'action': 0, 'reset': True})
    with pytest.raises(ValueError, match=r'expected an int in \[0, 4\)'):
        env.step({'action': 7, 'reset': False})
    env = Dummy('cont', size=(4, 4))
    env.step({'action': np.zeros(2), 'reset': True})
    with pytest.raises(ValueError, match=r'expected shape \(2,\)'):
        env.step({'action': np.zeros(3), 'reset': False})


def test_env_modules_import_without_jax_or_suites():
    launch.assert_imports_without(
        ['embodied', 'embodied.envs.dummy', 'embodied.envs.cartpole',
         'embodied.envs.from_gym', 'embodied.envs.from_dm',
         'embodied.agents.testing', 'embodied.run'],
        ['jax', 'gymnasium', 'dm_env', 'dm_control'])


# FromGym


def test_from_gym_cartpole():
    pytest.importorskip('gymnasium')
    from embodied.envs.from_gym import FromGym
    env = FromGym('CartPole-v1', seed=5)
    assert env.obs_space['vector'].dtype == np.float32
    assert env.obs_space['vector'].shape == (4,)
    action = env.act_space['action']
    assert action.dtype == np.int32 and action.shape == ()
    assert action.low == 0 and action.high == 2
    obs = env.step({'action': np.int32(0), 'reset': True})
    check_in_spaces(env, obs)
    assert obs['is_first'] and obs['reward'] == 0
    first = obs['vector']
    for steps in range(1, 100):
        obs = env.step({'action': np.int32(1), 'reset': False})
        check_in_spaces(env, obs)
        assert obs['reward'] == 1
        if obs['is_last']:
            break
    assert obs['is_terminal'] and steps < 100
    again = FromGym('CartPole-v1', seed=5)
    np.testing.assert_array_equal(
        again.step({'action': np.int32(0), 'reset': True})['vector'], first)
    env.close()
    again.close()


def test_from_gym_truncation_is_last_only():
    pytest.importorskip('gymnasium')
    from embodied.envs.from_gym import FromGym
    env = FromGym('CartPole-v1', seed=0, max_episode_steps=4)
    env.step({'action': np.int32(0), 'reset': True})
    lasts = []
    for index in range(4):
        obs = env.step({'action': np.int32(index % 2), 'reset': False})
        lasts.append(bool(obs['is_last']))
        assert not obs['is_terminal']
    assert lasts == [False, False, False, True]
    assert env.step({'action': np.int32(0), 'reset': False})['is_first']


def make_dict_gym_env():
    gymnasium = pytest.importorskip('gymnasium')
    spaces = gymnasium.spaces

    class DictEnv(gymnasium.Env):
        observation_space = spaces.Dict({
            'image': spaces.Box(0, 255, (4, 4, 3), np.uint8),
            'reward': spaces.Box(-1.0, 1.0, (), np.float64),
            'nested': spaces.Dict({'level': spaces.Discrete(3, start=1)}),
        })
        action_space = spaces.Dict({
            'move': spaces.Discrete(3, start=-1),
            'arm': spaces.Box(-1.0, 1.0, (2,), np.float32),
        })

        def __init__(self):
            self.actions = []

        def _obs(self, level):
            return {
                'image': np.full((4, 4, 3), 255, np.uint8),
                'reward': np.float64(0.5),
                'nested': {'level': np.int64(level)}}

        def reset(self, seed=None, options=None):
            super().reset(seed=seed)
            return self._obs(1), {'seed': seed}

        def step(self, action):
            self.actions.append(action)
            return self._obs(3), 2.0, False, True, {}

    return DictEnv()


def test_from_gym_dict_spaces():
    from embodied.envs.from_gym import FromGym
    inner = make_dict_gym_env()
    env = FromGym(inner, seed=11)
    assert set(env.obs_space) == {
        'image', 'obs_reward', 'nested/level',
        'reward', 'is_first', 'is_last', 'is_terminal'}
    assert env.obs_space['image'].dtype == np.uint8
    assert env.obs_space['image'].high.max() == 256  # Exclusive high.
    assert env.obs_space['obs_reward'].dtype == np.float32
    level = env.obs_space['nested/level']
    assert level.dtype == np.int32 and level.high == 3 and level.low == 0
    assert set(env.act_space) == {'move', 'arm', 'reset'}
    assert env.act_space['move'].classes == 3
    obs = env.step({'move': 0, 'arm': np.zeros(2), 'reset': True})
    assert env.info == {'seed': 11}
    assert obs['nested/level'] == 0  # Discrete start 1 maps to 0.
    check_in_spaces(env, obs)
    obs = env.step({
        'move': np.int32(2), 'arm': np.array([0.5, -0.5]), 'reset': False})
    check_in_spaces(env, obs)
    assert obs['nested/level'] == 2 and obs['obs_reward'] == 0.5
    assert obs['reward'] == 2 and obs['is_last'] and not obs['is_terminal']
    sent = inner.actions[-1]
    assert sent['move'] == 1  # Class 2 with start -1.
    assert sent['arm'].dtype == np.float32
    np.testing.assert_array_equal(sent['arm'], [0.5, -0.5])


@pytest.mark.filterwarnings('ignore:.*render method without')
def test_from_gym_bad_input():
    gymnasium = pytest.importorskip('gymnasium')
    from embodied.envs.from_gym import FromGym
    with pytest.raises(TypeError, match='only apply when env is an id'):
        FromGym(make_dict_gym_env(), max_episode_steps=3)

    class TextEnv(gymnasium.Env):
        observation_space = gymnasium.spaces.Text(5)
        action_space = gymnasium.spaces.Discrete(2)

    with pytest.raises(TypeError, match="observation 'vector' has a Text"):
        FromGym(TextEnv())
    env = FromGym('CartPole-v1')
    env.step({'action': 0, 'reset': True})
    with pytest.raises(KeyError, match="missing key 'action'"):
        env.step({'reset': False})
    with pytest.raises(RuntimeError, match="render_mode='rgb_array'"):
        env.render()
    env.close()


def test_from_gym_render():
    pytest.importorskip('gymnasium')
    pytest.importorskip('pygame')
    from embodied.envs.from_gym import FromGym
    env = FromGym('CartPole-v1', render_mode='rgb_array')
    env.step({'action': 0, 'reset': True})
    image = env.render()
    assert image.dtype == np.uint8 and image.ndim == 3
    env.close()


def test_from_gym_render_frames_go_to_log_image():
    gymnasium = pytest.importorskip('gymnasium')
    from embodied.envs.from_gym import FromGym

    class Painted(gymnasium.Env):
        """Renders a 30 x 40 frame whose color is the step count."""
        observation_space = gymnasium.spaces.Box(-1, 1, (2,), np.float32)
        action_space = gymnasium.spaces.Discrete(2)
        metadata = {'render_modes': ['rgb_array']}

        def __init__(self, render_mode=None):
            self.render_mode = render_mode
            self.count = 0

        def reset(self, seed=None, options=None):
            self.count = 0
            return np.zeros(2, np.float32), {}

        def step(self, action):
            self.count += 1
            return np.zeros(2, np.float32), 0.0, False, False, {}

        def render(self):
            frame = np.zeros((30, 40, 3), np.uint8)
            frame[:, 20:] = 10 * self.count  # The right half.
            return frame

    env = FromGym(Painted('rgb_array'), render=True, render_size=(6, 8))
    assert env.obs_space['log/image'] == elements.Space(np.uint8, (6, 8, 3))
    for t in range(3):
        obs = env.step({'action': np.int32(0), 'reset': t == 0})
        assert obs['log/image'].shape == (6, 8, 3)
        assert (obs['log/image'][:, :4] == 0).all()
        assert (obs['log/image'][:, 4:] == 10 * t).all()
    assert 'log/image' not in FromGym(Painted('rgb_array')).obs_space
    with pytest.raises(ValueError, match="render_mode 'rgb_array'.*None"):
        FromGym(Painted(), render=True)


# FromDM


def make_dm_env(obs_dict=True, end='termination'):
    dm_env = pytest.importorskip('dm_env')
    from dm_env import specs

    class TinyEnv(dm_env.Environment):
        """Three steps; the last ends by termination or truncation."""

        def __init__(self):
            self.actions = []
            self.steps = 0

        def observation_spec(self):
            if not obs_dict:
                return specs.Array((3,), np.float64, 'obs')
            return {
                'position': specs.Array((2,), np.float64, 'position'),
                'reward': specs.Array((), np.float64, 'reward'),
                'empty': specs.Array((0,), np.float64, 'empty'),
                'a/b': specs.BoundedArray((), np.int32, 0, 4, 'a/b'),
            }

        def action_spec(self):
            return specs.DiscreteArray(3, np.int32, 'action')

        def _obs(self):
            if not obs_dict:
                return np.full(3, self.steps, np.float64)
            return {
                'position': np.full(2, self.steps, np.float64),
                'reward': np.float64(-1.0),
                'empty': np.zeros(0),
                'a/b': np.int32(self.steps)}

        def reset(self):
            self.steps = 0
            return dm_env.restart(self._obs())

        def step(self, action):
            self.actions.append(action)
            self.steps += 1
            if self.steps < 3:
                return dm_env.transition(0.5, self._obs())
            if end == 'termination':
                return dm_env.termination(1.0, self._obs())
            return dm_env.truncation(1.0, self._obs())

    return TinyEnv()


@pytest.mark.parametrize('end', ['termination', 'truncation'])
def test_from_dm_episode(end):
    from embodied.envs.from_dm import FromDM
    inner = make_dm_env(end=end)
    env = FromDM(inner)
    assert set(env.obs_space) == {
        'position', 'obs_reward', 'a_b',
        'reward', 'is_first', 'is_last', 'is_terminal'}
    assert env.obs_space['position'].dtype == np.float32
    assert env.obs_space['a_b'].high == 5  # Inclusive maximum 4.
    action = env.act_space['action']
    assert action.dtype == np.int32 and action.classes == 3
    obs = env.step({'action': 0, 'reset': True})
    check_in_spaces(env, obs)
    assert obs['is_first'] and obs['reward'] == 0
    rewards, terminals, lasts = [], [], []
    for _ in range(3):
        obs = env.step({'action': np.int32(2), 'reset': False})
        check_in_spaces(env, obs)
        rewards.append(float(obs['reward']))
        terminals.append(bool(obs['is_terminal']))
        lasts.append(bool(obs['is_last']))
    assert rewards == [0.5, 0.5, 1.0]
    assert lasts == [False, False, True]
    assert terminals == [False, False, end == 'termination']
    assert obs['a_b'] == 3 and obs['obs_reward'] == -1
    assert inner.actions[-1] == 2 and inner.actions[-1].dtype == np.int32
    # After the last step, the next step starts a new episode.
    assert env.step({'action': 0, 'reset': False})['is_first']


def test_from_dm_flat_obs_uses_obs_key():
    from embodied.envs.from_dm import FromDM
    env = FromDM(make_dm_env(obs_dict=False), obs_key='state')
    obs = env.step({'action': 0, 'reset': True})
    assert obs['state'].shape == (3,) and obs['state'].dtype == np.float32
    with pytest.raises(KeyError, match="missing key 'action'"):
        env.step({'reset': False})
    with pytest.raises(TypeError, match='seed only applies'):
        FromDM(make_dm_env(), seed=1)


def test_from_dm_loads_dm_control_by_name():
    pytest.importorskip('dm_control')
    from embodied.envs.from_dm import FromDM
    with pytest.raises(ValueError, match="Unknown dm_control task"):
        FromDM('cartpole_balanse')
    env = FromDM('cartpole_balance', seed=0)
    obs = env.step({'action': np.zeros(1, np.float32), 'reset': True})
    check_in_spaces(env, obs)
    env.close()
