import math

import numpy as np
import pytest

from embodied.envs import cartpole
from embodied.envs.cartpole import CartPole

LEFT, RIGHT = 0, 1


def step(env, action=LEFT, reset=False):
    return env.step({'action': np.int32(action), 'reset': reset})


def reference_step(state, action):
    """CartPole-v1's equations, written out independently of the module."""
    x, x_dot, theta, theta_dot = state
    force = 10.0 if action == 1 else -10.0
    total_mass = 1.0 + 0.1
    pole_mass_length = 0.1 * 0.5
    temp = (force + pole_mass_length * theta_dot ** 2 * math.sin(theta)) / (
        total_mass)
    theta_acc = (9.8 * math.sin(theta) - math.cos(theta) * temp) / (
        0.5 * (4.0 / 3.0 - 0.1 * math.cos(theta) ** 2 / total_mass))
    x_acc = temp - pole_mass_length * theta_acc * math.cos(theta) / total_mass
    return (
        x + 0.02 * x_dot,
        x_dot + 0.02 * x_acc,
        theta + 0.02 * theta_dot,
        theta_dot + 0.02 * theta_acc)


def test_first_step_from_rest_matches_hand_derivation():
    # From rest, pushing right: temp = 10 / 1.1 = 100/11,
    # theta_acc = -(100/11) / (0.5 * (4/3 - 1/11)) = -6600/451,
    # x_acc = 100/11 + 0.05 * (6600/451) / 1.1 = 4400/451; times tau 0.02.
    expected = np.array([0.0, 88 / 451, 0.0, -132 / 451])
    np.testing.assert_allclose(
        cartpole.dynamics(np.zeros(4), RIGHT), expected, rtol=1e-12)
    np.testing.assert_allclose(
        cartpole.dynamics(np.zeros(4), LEFT), -expected, rtol=1e-12)


def test_trajectory_matches_reference_equations():
    env = CartPole('balance', seed=7)
    obs = step(env, reset=True)
    state = tuple(env.state)
    np.testing.assert_allclose(obs['vector'], state, rtol=1e-6)
    for action in (RIGHT, RIGHT, LEFT):
        state = reference_step(state, action)
        obs = step(env, action)
        np.testing.assert_allclose(env.state, state, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(obs['vector'], state, rtol=1e-6)
        assert obs['vector'].dtype == np.float32


def test_matches_gymnasium_cartpole():
    gymnasium = pytest.importorskip('gymnasium')
    env = CartPole('balance', seed=1)
    step(env, reset=True)
    reference = gymnasium.make('CartPole-v1').unwrapped
    reference.reset(seed=0)
    reference.state = env.state
    for action in [RIGHT] * 5 + [LEFT] * 5:
        expected, _, terminated, _, _ = reference.step(action)
        obs = step(env, action)
        np.testing.assert_allclose(obs['vector'], expected, rtol=1e-5)
        assert bool(obs['is_terminal']) == terminated


def test_render_draws_the_pole_where_it_leans():
    env = CartPole('balance', seed=0, render=True, render_size=(40, 60))
    assert env.obs_space['log/image'].shape == (40, 60, 3)
    assert 'log/image' not in CartPole('balance').obs_space
    obs = step(env, reset=True)
    assert obs['log/image'].dtype == np.uint8
    np.testing.assert_array_equal(obs['log/image'], env.render())
    pole = np.array([202, 152, 101], np.uint8)
    for theta, side in ((0.3, 1), (-0.3, -1)):
        image = cartpole.draw(np.array([0.0, 0.0, theta, 0.0]), (40, 60))
        cols = np.nonzero((image == pole).all(-1))[1]
        assert len(cols) and np.sign(cols.mean() - 30) == side
    with pytest.raises(ValueError, match='render_size'):
        CartPole('balance', render=True, render_size=(40,))


def test_reset_obs_and_initial_state():
    env = CartPole(seed=0)
    obs = step(env, reset=True)
    assert obs['is_first'] and not obs['is_last'] and not obs['is_terminal']
    assert obs['reward'] == 0 and obs['reward'].dtype == np.float32
    assert np.all(np.abs(obs['vector']) <= 0.05)
    for key, space in env.obs_space.items():
        assert obs[key] in space, key


def test_falling_is_terminal():
    env = CartPole(seed=0)
    step(env, reset=True)
    for steps in range(1, 100):
        obs = step(env, RIGHT)
        assert obs['reward'] == 1
        if obs['is_last']:
            break
        assert not obs['is_terminal']
    assert obs['is_terminal'] and obs['is_last']
    assert 5 < steps < 50
    assert cartpole.has_fallen(env.state)
    x, _, theta, _ = env.state
    assert abs(theta) > 12 * 2 * math.pi / 360 or abs(x) > 2.4
    # The next step starts a new episode even without `reset`.
    assert step(env, LEFT)['is_first']


def test_length_cap_is_last_but_not_terminal():
    env = CartPole(length=10, seed=0)
    step(env, reset=True)
    for steps in range(1, 11):
        obs = step(env, steps % 2)
        assert bool(obs['is_last']) == (steps == 10)
        assert not obs['is_terminal']
    assert step(env, LEFT)['is_first']


def test_same_seed_same_trajectory():
    actions = np.random.default_rng(0).integers(0, 2, 40)

    def rollout(seed):
        env = CartPole(seed=seed)
        vectors = [step(env, reset=True)['vector']]
        vectors += [step(env, action)['vector'] for action in actions]
        return np.array(vectors)

    np.testing.assert_array_equal(rollout(3), rollout(3))
    assert not np.array_equal(rollout(3)[0], rollout(4)[0])


def test_spaces():
    env = CartPole()
    assert env.obs_space['vector'].shape == (4,)
    assert env.obs_space['vector'].dtype == np.float32
    action = env.act_space['action']
    assert action.dtype == np.int32 and action.classes == 2
    assert set(env.act_space) == {'action', 'reset'}


def test_bad_input_raises_clear_errors():
    with pytest.raises(
            ValueError, match="Unknown CartPole task 'swingup'.*balance"):
        CartPole('swingup')
    with pytest.raises(ValueError, match='length'):
        CartPole(length=0)
    env = CartPole(seed=0)
    step(env, reset=True)
    with pytest.raises(ValueError, match='expected 0 .* or 1'):
        step(env, 2)
