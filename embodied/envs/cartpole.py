"""CartPole in pure numpy, with the dynamics of gymnasium's CartPole-v1."""

import math

import elements
import numpy as np

from embodied.core import base
from embodied.core import checks

TASKS = ('balance',)

GRAVITY = 9.8
CART_MASS = 1.0
POLE_MASS = 0.1
TOTAL_MASS = CART_MASS + POLE_MASS
POLE_HALF_LENGTH = 0.5
POLE_MASS_LENGTH = POLE_MASS * POLE_HALF_LENGTH
FORCE = 10.0
TAU = 0.02
X_LIMIT = 2.4
THETA_LIMIT = 12 * 2 * math.pi / 360
INIT_RANGE = 0.05
# The drawing, in the world's units (the image spans the track, 4.8 wide).
CART_SIZE = (0.4, 0.24)
POLE_WIDTH = 0.08


def dynamics(state, action):
    """One Euler step of CartPole-v1; state is (x, x_dot, theta, theta_dot)."""
    x, x_dot, theta, theta_dot = state
    force = FORCE if action == 1 else -FORCE
    cos, sin = math.cos(theta), math.sin(theta)
    temp = (force + POLE_MASS_LENGTH * theta_dot ** 2 * sin) / TOTAL_MASS
    theta_acc = (GRAVITY * sin - cos * temp) / (
        POLE_HALF_LENGTH * (4 / 3 - POLE_MASS * cos ** 2 / TOTAL_MASS))
    x_acc = temp - POLE_MASS_LENGTH * theta_acc * cos / TOTAL_MASS
    return np.array([
        x + TAU * x_dot,
        x_dot + TAU * x_acc,
        theta + TAU * theta_dot,
        theta_dot + TAU * theta_acc,
    ], np.float64)


def has_fallen(state):
    x, _, theta, _ = state
    return bool(abs(x) > X_LIMIT or abs(theta) > THETA_LIMIT)


def draw(state, size):
    """The scene of `state` as uint8 (H, W, 3), drawn as gymnasium's
    CartPole draws it: the track across the image, a dark cart on it and a
    brown pole of length 1 on the cart, on white."""
    height, width = size
    scale = width / (2 * X_LIMIT)
    rows, cols = np.mgrid[:height, :width] + 0.5
    x = cols / scale - X_LIMIT  # World units, y upwards from the track.
    y = (0.75 * height - rows) / scale
    cart_x, _, theta, _ = state
    image = np.full((height, width, 3), 255, np.uint8)
    image[np.abs(y) <= 0.5 / scale] = 0  # The track, one pixel.
    cart = (np.abs(x - cart_x) <= CART_SIZE[0] / 2) & (
        np.abs(y) <= CART_SIZE[1] / 2)
    image[cart] = (30, 30, 30)
    # The pole: points within half its width of the segment from the pivot
    # (the cart's top) to its tip.
    tip = np.array([math.sin(theta), math.cos(theta)]) * 2 * POLE_HALF_LENGTH
    px, py = x - cart_x, y - CART_SIZE[1] / 4
    along = np.clip((px * tip[0] + py * tip[1]) / (tip @ tip), 0, 1)
    distance = np.hypot(px - along * tip[0], py - along * tip[1])
    image[distance <= POLE_WIDTH / 2] = (202, 152, 101)
    return image


class CartPole(base.Env):
    """Keep a pole upright by pushing the cart left (action 0) or right (1).

    Reward is 1 per step after the reset step. Falling (|x| > 2.4 or
    |theta| > 12 degrees) ends the episode with `is_terminal`; reaching
    `length` steps ends it with `is_last` only. With `render`, each step
    also draws the scene (`draw`) at `render_size` (height, width) into
    `log/image`, which the logger and `run.eval_video` show as episode
    videos and the agent never sees.
    """

    def __init__(self, task='balance', length=500, seed=None, render=False,
                 render_size=(128, 192)):
        checks.choice('CartPole', 'task', task, TASKS)
        checks.integers('CartPole', 1, length=length)
        if len(render_size) != 2:
            raise ValueError(f'CartPole: render_size must be (height, '
                             f'width), got {render_size!r}.')
        checks.integers('CartPole', 2, **{
            'render_size height': render_size[0],
            'render_size width': render_size[1]})
        self.task = task
        self.length = int(length)
        self.render_size = tuple(int(x) for x in render_size)
        self._render = bool(render)
        self._rng = np.random.default_rng(seed)
        self._state = np.zeros(4, np.float64)
        self._step = 0
        self._done = True

    @property
    def obs_space(self):
        spaces = {
            'vector': elements.Space(np.float32, (4,)),
            **base.step_spaces(),
        }
        if self._render:
            spaces['log/image'] = elements.Space(
                np.uint8, (*self.render_size, 3))
        return spaces

    @property
    def act_space(self):
        return base.discrete_act_space(2)

    @property
    def state(self):
        """The physical state (x, x_dot, theta, theta_dot) as float64."""
        return self._state.copy()

    def step(self, action):
        if action['reset'] or self._done:
            self._state = self._rng.uniform(-INIT_RANGE, INIT_RANGE, 4)
            self._step = 0
            self._done = False
            return self._obs(0.0, is_first=True)
        move = np.asarray(action['action'])
        if move.shape != () or int(move) not in (0, 1):
            raise ValueError(
                f'CartPole action: expected 0 (left) or 1 (right), '
                f'got {action["action"]!r}.')
        self._state = dynamics(self._state, int(move))
        self._step += 1
        fallen = has_fallen(self._state)
        self._done = fallen or self._step >= self.length
        return self._obs(1.0, is_last=self._done, is_terminal=fallen)

    def render(self):
        """The current scene, uint8 (H, W, 3) at `render_size`."""
        return draw(self._state, self.render_size)

    def _obs(self, reward, is_first=False, is_last=False, is_terminal=False):
        obs = {
            'vector': self._state.astype(np.float32),
            'reward': np.float32(reward),
            'is_first': np.bool_(is_first),
            'is_last': np.bool_(is_last),
            'is_terminal': np.bool_(is_terminal),
        }
        if self._render:
            obs['log/image'] = self.render()
        return obs
