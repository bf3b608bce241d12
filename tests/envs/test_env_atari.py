"""The Atari adapter against frames and lives read from ale-py directly."""

import numpy as np
import pytest

ale_py = pytest.importorskip('ale_py')

from embodied.core.wrappers import check_values  # noqa: E402
from embodied.envs.atari import Atari  # noqa: E402

FULL = (210, 160)  # ALE's screen; resizing to it leaves frames unchanged.


def direct_ale(game, seed, sticky=False):
    """An ALEInterface set up as the adapter documents: the adapter's first
    random draw from `seed` seeds the emulator."""
    rng = np.random.default_rng(seed)
    ale = ale_py.ALEInterface()
    ale.setLoggerMode(ale_py.LoggerMode.Error)
    ale.setInt('random_seed', int(rng.integers(0, 2 ** 31)))
    ale.setFloat('repeat_action_probability', 0.25 if sticky else 0.0)
    ale.loadROM(ale_py.roms.get_rom_path(game))
    ale.reset_game()
    return ale, rng


def screen(ale):
    return ale.getScreenRGB().copy()


def reset(env):
    return env.step({'action': np.int32(0), 'reset': True})


def act(env, index):
    return env.step({'action': np.int32(index), 'reset': False})


@pytest.mark.parametrize('kwargs,shape,actions', [
    (dict(size=(96, 96), gray=True, actions='all'), (96, 96, 1), 18),
    (dict(size=(64, 64), gray=False, actions='needed'), (64, 64, 3), 6),
    (dict(size=(48, 80), gray=False, resize='opencv'), (48, 80, 3), 18),
])
def test_spaces_and_fifty_steps(kwargs, shape, actions):
    env = Atari('pong', noops=30, seed=1, **kwargs)
    assert env.obs_space['image'].shape == shape
    assert env.obs_space['image'].dtype == np.uint8
    assert env.act_space['action'].dtype == np.int32
    assert env.act_space['action'].high == actions
    assert env.act_space['action'].discrete
    rng = np.random.default_rng(0)
    obs = reset(env)
    assert obs['is_first'] and not obs['is_last']
    for _ in range(50):
        check_values('obs', obs, env.obs_space)
        assert set(obs) == set(env.obs_space)
        obs = act(env, rng.integers(actions))
        assert not obs['is_first']
    assert obs['image'].std() > 0


def test_max_pools_the_last_two_frames_of_each_repeat():
    env = Atari('pong', repeat=4, pooling=2, size=FULL, gray=False,
                sticky=False, noops=0, actions='all', seed=3)
    ale, _ = direct_ale('pong', seed=3)
    first = reset(env)
    np.testing.assert_array_equal(first['image'], screen(ale))
    actions = [0, 3, 3, 4, 1, 0, 2, 5] * 10
    pooled_differs = 0
    for index in actions:
        frames = []
        for _ in range(4):
            ale.act(ale.getLegalActionSet()[index])
            frames.append(screen(ale))
        obs = act(env, index)
        expected = np.maximum(frames[-2], frames[-1])
        np.testing.assert_array_equal(obs['image'], expected)
        pooled_differs += not np.array_equal(expected, frames[-1])
    assert pooled_differs > 10  # The pooling was tested, not just the frame.


def test_mean_pooling_over_three_frames():
    env = Atari('pong', repeat=4, pooling=3, aggregate='mean', size=FULL,
                gray=False, sticky=False, seed=0)
    ale, _ = direct_ale('pong', seed=0)
    reset(env)
    for index in [3, 4, 0, 3] * 5:
        frames = []
        for _ in range(4):
            ale.act(ale.getLegalActionSet()[index])
            frames.append(screen(ale))
        expected = np.mean(frames[-3:], 0).astype(np.uint8)
        np.testing.assert_array_equal(act(env, index)['image'], expected)


def test_reset_does_not_pool_frames_of_the_previous_episode():
    env = Atari('pong', size=FULL, gray=False, sticky=False, seed=0)
    ale, _ = direct_ale('pong', seed=0)
    start = screen(ale)
    reset(env)
    for _ in range(100):
        obs = act(env, 3)
    assert not np.array_equal(obs['image'], start)
    again = reset(env)
    assert again['is_first']
    np.testing.assert_array_equal(again['image'], start)


def test_gray_and_resize_match_pillow_and_opencv():
    from PIL import Image
    ale, _ = direct_ale('pong', seed=0)
    frame = screen(ale)
    weights = np.array([0.299, 0.587, 0.114])
    resized = np.asarray(Image.fromarray(frame).resize((80, 48),
                                                       Image.BILINEAR))
    gray = np.einsum('hwc,c->hw', resized.astype(np.float64), weights)
    env = Atari('pong', size=(48, 80), gray=True, sticky=False, seed=0)
    image = reset(env)['image']
    assert image.shape == (48, 80, 1)
    # Luminance truncated to uint8: allow one level for float rounding.
    assert np.abs(image[..., 0].astype(int) - gray.astype(int)).max() <= 1
    assert np.mean(image[..., 0] == gray.astype(np.uint8)) > 0.99

    cv2 = pytest.importorskip('cv2')
    env = Atari('pong', size=(48, 80), gray=False, sticky=False,
                resize='opencv', seed=0)
    expected = cv2.resize(frame, (80, 48), interpolation=cv2.INTER_AREA)
    np.testing.assert_array_equal(reset(env)['image'], expected)


def lives_reference(mode, repeat=4, steps=3000):
    """Breakout with FIRE held, run frame by frame on ALE directly: per
    agent step (is_last, is_terminal, lives after it), with the adapter's
    documented rules (a step stops early when it ends or loses a life while
    lives matter)."""
    ale, _ = direct_ale('breakout', seed=0)
    fire = ale.getLegalActionSet()[1]
    prev = ale.lives()
    result = []
    for _ in range(steps):
        terminal = last = False
        for _ in range(repeat):
            ale.act(fire)
            lives = ale.lives()
            if ale.game_over():
                terminal = last = True
            lost = 0 < lives < prev
            prev = lives
            if lost and mode == 'discount':
                terminal = True
            if lost and mode == 'reset':
                terminal = last = True
            if terminal or last:
                break
        result.append((last, terminal, lives))
        if last:
            return result
    raise AssertionError('breakout did not end')


@pytest.mark.parametrize('mode', ['unused', 'discount', 'reset'])
def test_lives_semantics_match_ale(mode):
    env = Atari('breakout', lives=mode, size=FULL, sticky=False, seed=0)
    expected = lives_reference(mode)
    reset(env)
    got = []
    for _ in expected:
        obs = act(env, 1)
        got.append((bool(obs['is_last']), bool(obs['is_terminal'])))
    assert got == [(last, term) for last, term, _ in expected]
    terminals = sum(term for _, term, _ in expected)
    if mode == 'unused':
        assert terminals == 1 and expected[-1][2] == 0  # Game over only.
    elif mode == 'discount':
        assert terminals == 5 and expected[-1][2] == 0  # 4 lives, then over.
    else:
        assert terminals == 1 and expected[-1][2] == 4  # The first life.
    if mode == 'reset':
        assert reset(env)['is_first']


def test_time_limit_ends_without_terminal():
    env = Atari('pong', length=40, repeat=4, sticky=False, seed=0)
    reset(env)
    flags = [act(env, 0) for _ in range(10)]
    assert [bool(o['is_last']) for o in flags] == [False] * 9 + [True]
    assert not any(o['is_terminal'] for o in flags)
    assert act(env, 0)['is_first']


def test_noops_take_a_seeded_random_number_of_frames():
    counts = []
    for seed in range(8):
        env = Atari('pong', noops=30, sticky=False, seed=seed)
        reset(env)
        _, rng = direct_ale('pong', seed)
        expected = int(rng.integers(31))
        assert env.ale.getEpisodeFrameNumber() == expected
        counts.append(expected)
    assert len(set(counts)) > 3
    env = Atari('pong', noops=0, sticky=False, seed=0)
    reset(env)
    assert env.ale.getEpisodeFrameNumber() == 0


@pytest.mark.parametrize('sticky', [False, True])
def test_sticky_actions_match_ale_with_the_same_seed(sticky):
    env = Atari('breakout', sticky=sticky, size=FULL, gray=False, repeat=1,
                pooling=1, seed=5)
    ale, _ = direct_ale('breakout', 5, sticky=sticky)
    plain, _ = direct_ale('breakout', 5, sticky=False)
    reset(env)
    rng = np.random.default_rng(0)
    differs = 0
    for _ in range(400):
        index = int(rng.integers(18))
        ale.act(ale.getLegalActionSet()[index])
        plain.act(plain.getLegalActionSet()[index])
        image = act(env, index)['image']
        np.testing.assert_array_equal(image, screen(ale))
        differs += not np.array_equal(image, screen(plain))
    assert (differs > 0) == sticky


def test_needed_actions_are_the_minimal_set():
    env = Atari('pong', actions='needed', size=FULL, gray=False, repeat=1,
                pooling=1, sticky=False, seed=0)
    ale, _ = direct_ale('pong', 0)
    minimal = ale.getMinimalActionSet()
    assert env.act_space['action'].high == len(minimal)
    reset(env)
    for index in [2, 2, 3, 2, 1, 0, 2, 2, 2] * 10:
        ale.act(minimal[index])
        np.testing.assert_array_equal(act(env, index)['image'], screen(ale))


def test_autostart_presses_fire_and_up():
    env = Atari('breakout', autostart=True, sticky=False, seed=0)
    reset(env)
    assert env.ale.getEpisodeFrameNumber() == 2


def test_clip_reward_keeps_the_sign():
    env = Atari('pong', clip_reward=True, sticky=False, seed=0, repeat=8)
    reset(env)
    rewards = [float(act(env, 0)['reward']) for _ in range(300)]
    assert set(rewards) <= {-1.0, 0.0, 1.0} and -1.0 in rewards


@pytest.mark.parametrize('kwargs,message', [
    (dict(lives='always'), 'lives'),
    (dict(actions='some'), 'actions'),
    (dict(resize='magic'), 'resize'),
    (dict(aggregate='min'), 'aggregate'),
    (dict(repeat=0), 'repeat'),
    (dict(size=(64,)), 'size'),
])
def test_bad_arguments_name_the_key(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Atari('pong', **kwargs)


def test_unknown_game_suggests_close_names():
    with pytest.raises(ValueError, match="Unknown Atari game 'pongg'.*pong"):
        Atari('pongg')


def test_out_of_range_action_is_refused():
    env = Atari('pong', actions='needed', seed=0)
    reset(env)
    with pytest.raises(ValueError, match='action 6 is out of range'):
        act(env, 6)


def test_make_env_uses_the_atari100k_block(tmp_path):
    from embodied import main
    config = main.parse(['--configs', 'atari100k', '--logdir', str(tmp_path)])
    env = main.make_env(config, 0)
    assert env.obs_space['image'].shape == (64, 64, 3)
    assert env.act_space['action'].high == 6  # needed actions of pong
    env.close()
    config = main.parse(['--configs', 'atari', '--logdir', str(tmp_path)])
    env = main.make_env(config, 0)
    assert env.obs_space['image'].shape == (96, 96, 1)
    assert env.act_space['action'].high == 18
    env.close()


def test_no_ale_banner_in_a_fresh_process():
    """The first Atari env of a process prints nothing: ALE's banner would
    come from every env worker of a parallel run."""
    import subprocess
    import sys
    code = ('from embodied.envs.atari import Atari; '
            'Atari("pong", size=(64, 64)).close()')
    result = subprocess.run(
        [sys.executable, '-c', code], capture_output=True, text=True,
        timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert 'A.L.E' not in result.stdout + result.stderr
    assert 'Stella' not in result.stdout + result.stderr
