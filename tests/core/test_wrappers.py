import numpy as np
import pytest

import embodied
from embodied.core import wrappers

Space = embodied.Space


class TinyEnv(embodied.Env):
    """Counts steps; episodes last `length` steps; records the actions."""

    def __init__(self, length=5, image=(8, 8, 3), act=None, obs_dtype=None):
        self.length = length
        self.image = image
        self.act = act or Space(np.float32, (2,), -1, 1)
        self.obs_dtype = obs_dtype or np.float32
        self.count = 0
        self.actions = []
        self.closed = False

    @property
    def obs_space(self):
        return {
            'image': Space(np.uint8, self.image),
            'pos': Space(self.obs_dtype, (), 0, 100),
            **embodied.core.base.step_spaces(),
        }

    @property
    def act_space(self):
        return {'action': self.act, 'reset': Space(bool)}

    def step(self, action):
        self.actions.append(action)
        if action['reset']:
            self.count = 0
        else:
            self.count += 1
        image = np.zeros(self.image, np.uint8)
        image[..., 0] = np.arange(self.image[1], dtype=np.uint8)
        return {
            'image': image,
            'pos': np.asarray(self.count, self.obs_dtype),
            'reward': np.float32(1),
            'is_first': self.count == 0,
            'is_last': self.count >= self.length,
            'is_terminal': self.count >= self.length,
        }

    def close(self):
        self.closed = True


def act(value=(0, 0), reset=False):
    return {'action': np.asarray(value, np.float32), 'reset': reset}


class TestTimeLimit:

    def test_cuts_episode(self):
        env = wrappers.TimeLimit(TinyEnv(length=100), 3)
        obs = [env.step(act(reset=i == 0)) for i in range(6)]
        assert [o['is_first'] for o in obs] == [1, 0, 0, 0, 1, 0]
        assert [bool(o['is_last']) for o in obs] == [0, 0, 0, 1, 0, 0]
        assert not any(o['is_terminal'] for o in obs)
        # After the cut the env itself was reset.
        assert [int(o['pos']) for o in obs] == [0, 1, 2, 3, 0, 1]

    def test_no_reset_continues_env(self):
        env = wrappers.TimeLimit(TinyEnv(length=100), 2, reset=False)
        obs = [env.step(act(reset=i == 0)) for i in range(5)]
        assert [bool(o['is_first']) for o in obs] == [1, 0, 0, 1, 0]
        assert [bool(o['is_last']) for o in obs] == [0, 0, 1, 0, 0]
        assert [int(o['pos']) for o in obs] == [0, 1, 2, 3, 4]

    def test_no_reset_still_passes_env_resets(self):
        env = wrappers.TimeLimit(TinyEnv(length=2), 5, reset=False)
        resets = [True, False, False, True, False]
        obs = [env.step(act(reset=r)) for r in resets]
        assert [int(o['pos']) for o in obs] == [0, 1, 2, 0, 1]
        assert [bool(o['is_last']) for o in obs] == [0, 0, 1, 0, 0]

    def test_zero_disables(self):
        env = wrappers.TimeLimit(TinyEnv(length=100), 0)
        obs = [env.step(act(reset=i == 0)) for i in range(10)]
        assert not any(o['is_last'] for o in obs)


class TestActionRepeat:

    def test_repeats_and_sums_reward(self):
        inner = TinyEnv(length=100)
        env = wrappers.ActionRepeat(inner, 3)
        env.step(act(reset=True))
        obs = env.step(act())
        assert obs['reward'] == 3 and obs['reward'].dtype == np.float32
        assert int(obs['pos']) == 3
        assert len(inner.actions) == 4

    def test_stops_at_episode_end(self):
        env = wrappers.ActionRepeat(TinyEnv(length=2), 5)
        env.step(act(reset=True))
        obs = env.step(act())
        assert obs['is_last'] and obs['reward'] == 2

    def test_bad_repeat(self):
        with pytest.raises(ValueError, match='repeat must be'):
            wrappers.ActionRepeat(TinyEnv(), 0)


class TestNormalizeAction:

    def test_maps_to_bounds(self):
        space = Space(np.float32, (3,), [0, -10, -np.inf], [4, 10, np.inf])
        inner = TinyEnv(act=space)
        env = wrappers.NormalizeAction(inner)
        new = env.act_space['action']
        assert (new.low == [-1, -1, -np.inf]).all()
        assert (new.high == [1, 1, np.inf]).all()
        assert new.dtype == np.float32
        env.step({'action': np.float32([-1, 1, 7]), 'reset': False})
        env.step({'action': np.float32([0, 0, -3]), 'reset': False})
        sent = [a['action'] for a in inner.actions]
        assert np.allclose(sent[0], [0, 10, 7])
        assert np.allclose(sent[1], [2, 0, -3])
        assert sent[0].dtype == np.float32

    def test_rejects_discrete(self):
        env = TinyEnv(act=Space(np.int32, (), 0, 4))
        with pytest.raises(ValueError, match='discrete'):
            wrappers.NormalizeAction(env)

    def test_unknown_key(self):
        with pytest.raises(KeyError, match="no act 'steer'"):
            wrappers.NormalizeAction(TinyEnv(), 'steer')


class TestClipAction:

    def test_clips_and_keeps_dtype(self):
        inner = TinyEnv()
        env = wrappers.ClipAction(inner, low=-0.5, high=0.5)
        env.step(act([3, -0.2]))
        sent = inner.actions[0]['action']
        assert np.allclose(sent, [0.5, -0.2]) and sent.dtype == np.float32


class TestUnifyDtypes:

    def test_converts_spaces_and_values(self):
        inner = TinyEnv(
            obs_dtype=np.float64, act=Space(np.int64, (), 0, 3))
        env = wrappers.UnifyDtypes(inner)
        assert env.obs_space['pos'].dtype == np.float32
        assert env.obs_space['image'].dtype == np.uint8
        assert env.obs_space['is_first'].dtype == bool
        assert env.act_space['action'].dtype == np.int32
        assert env.act_space['action'].high == 3
        obs = env.step({'action': np.int32(1), 'reset': True})
        assert obs['pos'].dtype == np.float32
        assert obs['image'].dtype == np.uint8
        assert np.asarray(obs['is_first']).dtype == bool
        assert inner.actions[0]['action'].dtype == np.int64

    def test_int_bounds_fit_int32(self):
        inner = TinyEnv(act=Space(np.int64, (2,)))
        space = wrappers.UnifyDtypes(inner).act_space['action']
        assert space.low.min() == np.iinfo(np.int32).min
        assert space.high.max() == np.iinfo(np.int32).max


class BadObsEnv(TinyEnv):
    """Replaces one observation with a bad value."""

    def __init__(self, change, **kwargs):
        super().__init__(**kwargs)
        self.change = change

    def step(self, action):
        obs = super().step(action)
        self.change(obs)
        return obs


def _set(key, value):
    return lambda obs: obs.update({key: value})


BAD_OBS = [  # (change, expected texts) of an obs that fails its space.
    pytest.param(
        lambda obs: obs.pop('image'),
        ["obs 'image': missing", 'Space(uint8, shape=(8, 8, 3)',
         'got no such key'], id='missing'),
    pytest.param(
        _set('extra', np.zeros(2)),
        ["obs 'extra': not in the obs space", "'image'",
         'got float64 array of shape (2,)'], id='extra'),
    pytest.param(
        _set('image', np.full((8, 8), -1.0, np.float32)),
        ["obs 'image': wrong shape",
         'expected Space(uint8, shape=(8, 8, 3), low=0, high=255)',
         'got float32 array of shape (8, 8) [min -1.0, max -1.0]'],
        id='shape'),
    pytest.param(
        _set('image', np.ones((8, 8, 3), np.float32)),
        ["obs 'image': wrong dtype", 'got float32 array of shape (8, 8, 3)'],
        id='dtype'),
    pytest.param(
        _set('pos', np.float32(101)),
        ["obs 'pos': out of bounds", 'low=0', 'high=100',
         'got float32 scalar of shape () [min 101.0, max 101.0]'],
        id='above'),
    pytest.param(
        _set('pos', np.float32(-0.5)), ["obs 'pos': out of bounds"],
        id='below'),
    pytest.param(
        _set('reward', np.float32(np.nan)),
        ["obs 'reward': not finite", 'min nan'], id='nan'),
    pytest.param(
        _set('reward', np.float32(np.inf)), ["obs 'reward': not finite"],
        id='inf'),
    pytest.param(
        _set('reward', 'high'),
        ["obs 'reward': wrong type", "got str 'high'"], id='type'),
]


class TestCheckSpaces:

    def test_valid_passes(self):
        env = wrappers.CheckSpaces(TinyEnv())
        obs = env.step(act(reset=True))
        assert obs['image'].shape == (8, 8, 3)

    @pytest.mark.parametrize('change, expected', BAD_OBS)
    def test_bad_obs(self, change, expected):
        env = wrappers.CheckSpaces(BadObsEnv(change))
        with pytest.raises(ValueError) as info:
            env.step(act(reset=True))
        for text in expected:
            assert text in str(info.value)

    @pytest.mark.parametrize('change, expected', BAD_OBS)
    @pytest.mark.parametrize('stacked', [True, False])
    def test_bad_obs_in_a_stacked_batch(self, change, expected, stacked):
        # check_stacked checks the obs of several envs at once (stacked, or
        # obs by obs where they did not stack) and names the first bad one
        # with the message `step` gives.
        good = wrappers.CheckSpaces(TinyEnv())
        bad = wrappers.CheckSpaces(BadObsEnv(change))
        obs = [good.step(act(reset=True)) for _ in range(4)]
        obs[2] = bad.env.step(act(reset=True))  # Unchecked.
        batch = _stack(obs) if stacked else None
        with pytest.raises(wrappers.BatchSpaceError) as info:
            good.check_stacked(obs, batch)
        assert info.value.index == 2
        for text in expected:
            assert text in str(info.value)

    def test_check_stacked_passes_valid_obs(self):
        env = wrappers.CheckSpaces(TinyEnv())
        obs = [env.step(act(reset=True)) for _ in range(3)]
        env.check_stacked(obs, _stack(obs))
        env.check_stacked(obs)

    def test_check_stacked_accepts_python_numbers_that_fit(self):
        env = wrappers.CheckSpaces(
            BadObsEnv(_set('is_first', True)))
        obs = [env.step(act(reset=True)) for _ in range(2)]
        env.check_stacked(obs, _stack(obs))

    def test_shared_check_only_for_envs_of_the_same_spaces(self):
        envs = [wrappers.CheckSpaces(TinyEnv()) for _ in range(2)]
        assert wrappers.shared_check(envs) is envs[0]
        assert not any(env.check_obs for env in envs)
        assert wrappers.shared_check([*envs, TinyEnv()]) is None

    @pytest.mark.parametrize('action, expected', [
        ({'reset': False},
         ["action 'action': missing", 'Space(float32, shape=(2,)']),
        ({**act(), 'turbo': 1}, ["action 'turbo': not in the action space"]),
        ({**act(), 'action': np.float32([0.5, 2])},
         ["action 'action': out of bounds", 'low=-1', 'high=1',
          'got float32 array of shape (2,) [min 0.5, max 2.0]']),
        ({**act(), 'action': np.zeros(3, np.float32)},
         ["action 'action': wrong shape", 'shape (3,)']),
        ({**act(), 'action': np.zeros(2, np.float64)},
         ["action 'action': wrong dtype", 'float64']),
        ({**act(), 'action': np.float32([np.nan, 0])},
         ["action 'action': not finite"]),
    ], ids=['missing', 'extra', 'bounds', 'shape', 'dtype', 'nan'])
    def test_bad_action(self, action, expected):
        inner = TinyEnv()
        env = wrappers.CheckSpaces(inner)
        with pytest.raises(ValueError) as info:
            env.step(action)
        for text in expected:
            assert text in str(info.value)
        assert not inner.actions  # Checked before stepping.

    def test_integer_high_is_exclusive(self):
        env = wrappers.CheckSpaces(TinyEnv(act=Space(np.int32, (), 0, 4)))
        env.step({'action': np.int32(3), 'reset': False})
        with pytest.raises(ValueError, match="'action': out of bounds"):
            env.step({'action': np.int32(4), 'reset': False})

    def test_default_uint8_bound_allows_255(self):
        env = wrappers.CheckSpaces(
            BadObsEnv(_set('image', np.full((8, 8, 3), 255, np.uint8))))
        assert env.step(act(reset=True))['image'].max() == 255

    def test_overlapping_keys(self):
        class Overlap(TinyEnv):
            @property
            def act_space(self):
                return {**super().act_space, 'pos': Space(np.float32)}
        with pytest.raises(ValueError, match=r"\['pos'\] are in both"):
            wrappers.CheckSpaces(Overlap())


class TestDiscretizeAction:

    def test_bins_map_to_bounds(self):
        space = Space(np.float32, (2,), [-1, 0], [1, 10])
        inner = TinyEnv(act=space)
        env = wrappers.DiscretizeAction(inner, bins=3)
        new = env.act_space['action']
        assert new.dtype == np.int32 and new.shape == (2,)
        assert new.low.min() == 0 and new.high.max() == 3
        env.step({'action': np.int32([0, 2]), 'reset': False})
        env.step({'action': np.int32([1, 1]), 'reset': False})
        sent = [a['action'] for a in inner.actions]
        assert np.allclose(sent[0], [-1, 10]) and sent[0].dtype == np.float32
        assert np.allclose(sent[1], [0, 5])

    def test_bad_index(self):
        env = wrappers.DiscretizeAction(TinyEnv(), bins=3)
        with pytest.raises(ValueError, match=r'bin indices in \[0, 3\)'):
            env.step({'action': np.int32([0, 3]), 'reset': False})

    def test_rejects_discrete_space(self):
        with pytest.raises(ValueError, match='continuous vector'):
            wrappers.DiscretizeAction(TinyEnv(act=Space(np.int32, (), 0, 2)))


class TestResizeImage:

    def test_nearest(self):
        env = wrappers.ResizeImage(TinyEnv(image=(8, 8, 3)), size=(4, 2))
        assert env.obs_space['image'].shape == (4, 2, 3)
        assert env.obs_space['image'].dtype == np.uint8
        assert env.obs_space['pos'].shape == ()
        obs = env.step(act(reset=True))
        assert obs['image'].shape == (4, 2, 3)
        assert obs['image'].dtype == np.uint8
        # Columns 0..7 sampled at the centres of 2 output columns.
        assert list(obs['image'][0, :, 0]) == [2, 6]

    def test_area(self):
        env = wrappers.ResizeImage(
            TinyEnv(image=(4, 4, 3)), size=(2, 2), method='area')
        image = env.step(act(reset=True))['image']
        # Columns hold 0, 1, 2, 3: pairs average to 0.5 and 2.5, rounded.
        assert list(image[0, :, 0]) == [0, 2]
        assert image.dtype == np.uint8
        assert (image[..., 1] == 0).all()

    def test_area_upsamples(self):
        env = wrappers.ResizeImage(
            TinyEnv(image=(2, 2, 1)), size=(4, 4), method='area')
        image = env.step(act(reset=True))['image']
        assert list(image[0, :, 0]) == [0, 0, 1, 1]

    def test_same_size_untouched(self):
        env = wrappers.ResizeImage(TinyEnv(image=(4, 4, 3)), size=(4, 4))
        assert env.obs_space == env.env.obs_space

    def test_bad_key(self):
        with pytest.raises(ValueError, match="obs 'pos' must be an image"):
            wrappers.ResizeImage(TinyEnv(), keys=['pos'])


class FlakyEnv(TinyEnv):
    """Raises on its `fail_at`-th step."""

    def __init__(self, fail_at, error=RuntimeError):
        super().__init__()
        self.fail_at = fail_at
        self.error = error

    def step(self, action):
        if len(self.actions) == self.fail_at:
            self.actions.append(action)
            raise self.error('simulated crash')
        return super().step(action)


class TestRestartOnException:

    def test_restarts_and_resets(self):
        made = []

        def ctor():
            made.append(FlakyEnv(fail_at=2))
            return made[-1]

        env = wrappers.RestartOnException(ctor, wait=0)
        env.step(act(reset=True))
        env.step(act())
        obs = env.step(act())  # Fails, restarts, steps the new env.
        assert len(made) == 2 and made[0].closed
        assert obs['is_first'] and made[1].actions[0]['reset']
        assert env.obs_space == made[1].obs_space

    def test_too_many_failures_reraise(self):
        env = wrappers.RestartOnException(
            lambda: FlakyEnv(fail_at=0), maxfails=2, wait=0)
        with pytest.raises(RuntimeError, match='simulated crash') as info:
            env.step(act(reset=True))
        assert 'failed 3 times within 300 seconds' in ''.join(
            info.value.__notes__)

    def test_other_exceptions_pass_through(self):
        env = wrappers.RestartOnException(
            lambda: FlakyEnv(fail_at=0, error=KeyError),
            exceptions=(ValueError,), wait=0)
        with pytest.raises(KeyError):
            env.step(act(reset=True))


def test_unify_dtypes_leaves_other_kinds_for_check_spaces():
    from embodied.core import wrappers as wrapperslib
    import elements

    class FloatImageEnv(embodied.Env):
        obs_space = {
            'image': elements.Space(np.uint8, (2, 2, 3)),
            'reward': elements.Space(np.float32),
            'is_first': elements.Space(bool), 'is_last': elements.Space(bool),
            'is_terminal': elements.Space(bool)}
        act_space = {'reset': elements.Space(bool)}

        def step(self, action):
            return {'image': np.full((2, 2, 3), 0.5), 'reward': 1.0,
                    'is_first': True, 'is_last': False, 'is_terminal': False}

    env = wrapperslib.CheckSpaces(wrapperslib.UnifyDtypes(FloatImageEnv()))
    with pytest.raises(ValueError, match=r"obs 'image': wrong dtype.*float64"):
        env.step({'reset': True})
    obs = wrapperslib.UnifyDtypes(FloatImageEnv()).step({'reset': True})
    assert obs['reward'].dtype == np.float32  # float64 -> float32 is kept


class CountingRewardEnv(TinyEnv):
    """TinyEnv whose reward is the step count within the episode."""

    def step(self, action):
        obs = super().step(action)
        return {**obs, 'reward': np.float32(self.count)}


def test_backward_return_discounts_past_rewards_within_episodes():
    env = wrappers.BackwardReturn(CountingRewardEnv(length=4), horizon=10)
    space = env.obs_space['bwreturn']
    assert (space.dtype, space.shape) == (np.float32, ())
    discount = 0.9
    rewards, got = [], []
    obs = env.step(act(reset=True))
    for _ in range(12):
        if obs['is_first']:
            rewards = []
        rewards.append(float(obs['reward']))
        ages = np.arange(len(rewards))[::-1]
        expected = float(np.sum(np.array(rewards) * discount ** ages))
        got.append((float(obs['bwreturn']), expected))
        obs = env.step(act(reset=bool(obs['is_last'])))
    assert obs['bwreturn'].dtype == np.float32
    for value, expected in got:
        assert value == pytest.approx(expected, rel=1e-6)
    # Episode steps carry rewards 0, 1, 2, 3, 4: the last one of each has
    # 4 + 0.9 * 3 + 0.81 * 2 + 0.729 * 1.
    assert max(v for v, _ in got) == pytest.approx(4 + 2.7 + 1.62 + 0.729)
    with pytest.raises(ValueError, match='horizon must be >= 1'):
        wrappers.BackwardReturn(TinyEnv(), horizon=0)


def test_add_obs_adds_a_constant_key_and_its_space():
    space = Space(np.int32, (2,), 0, 10)
    value = np.array([3, 4], np.int32)
    env = wrappers.AddObs(TinyEnv(), 'goal', value, space)
    assert env.obs_space['goal'] is space
    assert set(env.obs_space) == set(TinyEnv().obs_space) | {'goal'}
    for count, reset in enumerate((True, False, False)):
        obs = env.step(act(reset=reset))
        assert obs['goal'] is value
        assert obs['pos'] == count  # The env's own obs pass through.
    with pytest.raises(ValueError, match="already has obs 'pos'"):
        wrappers.AddObs(TinyEnv(), 'pos', 0, Space(np.float32))
    assert embodied.wrappers.Wrapper is embodied.Wrapper


def _stack(obs):
    """The obs stacked per key, or None where they do not stack."""
    try:
        return {k: np.array([o[k] for o in obs]) for k in obs[0]}
    except Exception:
        return None


class TestReceived:
    """`wrappers.received`: what the env under the action wrappers receives,
    without stepping, for a batch of actions (what `load_policy` gives)."""

    def chain(self, inner):
        from embodied import config as configlib
        from embodied import factories
        config = configlib.build(['debug'])
        return factories.wrap_env(
            wrappers.TimeLimit(inner, 100), config)  # As the run wraps.

    def test_a_batch_is_what_each_step_delivers(self):
        space = Space(np.float64, (2,), [0, -10], [4, 10])
        inner = TinyEnv(act=space)
        env = self.chain(inner)
        batch = np.float32([[-3, 0.5], [0.25, 1.5], [1, -1]])
        got = wrappers.received(env, {'action': batch})
        env.step({'action': np.float32([0, 0]), 'reset': True})
        for row in batch:
            env.step({'action': row, 'reset': False})
        sent = np.stack([a['action'] for a in inner.actions[1:]])
        np.testing.assert_array_equal(got['action'], sent)
        assert got['action'].dtype == np.float64  # The env's own dtype.
        np.testing.assert_allclose(sent, [[0, 5], [2.5, 10], [4, -10]])

    def test_the_walk_stops_at_a_wrapper_of_your_own(self):
        class Doubled(embodied.Wrapper):
            def step(self, action):
                return self.env.step(
                    {**action, 'action': 2 * action['action']})

        inner = Doubled(TinyEnv())
        env = self.chain(inner)
        layers, under = wrappers.action_path(env)
        assert under is inner
        assert [type(x).__name__ for x in layers] == [
            'ClipAction', 'UnifyDtypes', 'NormalizeAction']
        got = wrappers.received(env, {'action': np.float32([[3, -0.5]])})
        np.testing.assert_allclose(got['action'], [[1, -0.5]])

    def test_discretize_maps_a_batch_of_bins(self):
        inner = TinyEnv(act=Space(np.float32, (2,), [-1, 0], [1, 10]))
        env = wrappers.DiscretizeAction(inner, bins=3)
        got = wrappers.received(env, {'action': np.int32([[0, 2], [1, 1]])})
        np.testing.assert_allclose(got['action'], [[-1, 10], [0, 5]])
