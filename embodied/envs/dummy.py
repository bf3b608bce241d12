"""A fast synthetic environment for tests and benchmarks.

Every observation carries `count`, the number of steps this env instance has
produced since it was constructed (0, 1, 2, ..., continuing across episodes;
float32 as in the original, exact up to 2**24 steps). The image, vector and
the other keys are deterministic functions of that count (`image_for`,
`vector_for`, ...), so a consumer far downstream (the test agent, a replay
test) can check that each step arrived intact and in order.

The observation keys, dtypes and shapes are the original's (`image`,
`vector` of 7, `token` in [0, 256), `count`, `float2d` 4x5, `int2d` 2x3 in
[0, 4), `reward`, `is_*`), so agents written for its dummy env build the
same inputs; every integer observation is bounded (an agent may one-hot
it). Unlike the original's, `count` does not restart with each episode.
"""

import functools
import os
import signal

import elements
import numpy as np

from embodied.core import base
from embodied.core import checks

TASKS = ('disc', 'cont')
# How a failing Dummy fails: an exception in `step`, its process killed by
# SIGSEGV or SIGKILL, an exception in the constructor, or an observation with
# a wrong image dtype or shape, a NaN in the vector, or no vector at all.
FAIL_MODES = (
    'raise', 'segfault', 'kill', 'init', 'dtype', 'shape', 'nan', 'keys')
VECTOR_SIZE = 7
TOKENS = 256
INT2D_CLASSES = 4
DISC_CLASSES = 4
CONT_SIZE = 2


def image_for(count, size):
    """The image shown at `count`: uint8, shape count.shape + size + (3,)."""
    count = np.asarray(count, np.int64)[..., None, None, None]
    # uint8 addition wraps around, which is the `% 256` of the pattern.
    return _pattern(tuple(size)) + (count % 256).astype(np.uint8)


@functools.lru_cache(maxsize=8)
def _pattern(size):
    """(3 y + 5 x + 7 channel) % 256: position-dependent, so that a
    transposed or shifted image is caught too."""
    height, width = size
    y = np.arange(height)[:, None, None]
    x = np.arange(width)[None, :, None]
    channel = np.arange(3)[None, None, :]
    pattern = ((3 * y + 5 * x + 7 * channel) % 256).astype(np.uint8)
    pattern.setflags(write=False)
    return pattern


def vector_for(count):
    """The vector shown at `count`: float32 in [-1, 1), shape (..., 7)."""
    count = np.asarray(count, np.int64)[..., None]
    offsets = 37 * np.arange(VECTOR_SIZE)
    return (((count + offsets) % 1000) / 500 - 1).astype(np.float32)


class Dummy(base.Env):
    """Dummy env with a discrete (`disc`) or continuous (`cont`) action.

    Episodes last `length` steps after the reset step and end with `is_last`
    (never `is_terminal`). Reward is 1 on every step but the first.

    For fault-injection tests, `fail_after` > 0 makes every step after the
    first `fail_after` steps of this instance fail as `fail_mode` says (see
    `FAIL_MODES`); `fail_mode: init` fails in the constructor instead.
    """

    def __init__(
            self, task, size=(64, 64), length=100, fail_after=0,
            fail_mode='raise'):
        checks.choice('Dummy', 'fail_mode', fail_mode, FAIL_MODES)
        if fail_after and fail_mode == 'init':
            raise RuntimeError('Dummy: failing in the constructor as asked '
                               '(fail_mode init).')
        self.fail_after = int(fail_after)
        self.fail_mode = fail_mode
        checks.choice('Dummy', 'task', task, TASKS)
        size = tuple(size)
        if len(size) != 2 or not all(
                isinstance(s, (int, np.integer)) and s > 0 for s in size):
            raise ValueError(
                f'Dummy size must be two positive ints (height, width), '
                f'got {size}.')
        checks.integers('Dummy', 1, length=length)
        self.task = task
        self.size = tuple(int(s) for s in size)
        self.length = int(length)
        self._count = 0
        self._step = 0
        self._position = 0.0
        self._done = True

    @property
    def obs_space(self):
        return {
            'image': elements.Space(np.uint8, self.size + (3,)),
            'vector': elements.Space(np.float32, (VECTOR_SIZE,), -1, 1),
            'token': elements.Space(np.int32, (), 0, TOKENS),
            'count': elements.Space(np.float32, (), 0),
            'float2d': elements.Space(np.float32, (4, 5), -1, 1),
            'int2d': elements.Space(np.int32, (2, 3), 0, INT2D_CLASSES),
            **base.step_spaces(),
            'log/player_pos': elements.Space(np.float32),
            'log/episode_step': elements.Space(np.int32, (), 0),
        }

    @property
    def act_space(self):
        if self.task == 'disc':
            action = elements.Space(np.int32, (), 0, DISC_CLASSES)
        else:
            action = elements.Space(np.float32, (CONT_SIZE,), -1, 1)
        return {'action': action, 'reset': elements.Space(bool)}

    def step(self, action):
        if action['reset'] or self._done:
            self._step = 0
            self._position = 0.0
            self._done = False
            obs = self._obs(reward=0.0, is_first=True)
        else:
            self._position += self._movement(action['action'])
            self._step += 1
            self._done = self._step >= self.length
            obs = self._obs(reward=1.0, is_last=self._done)
        if self.fail_after and self._count > self.fail_after:
            obs = self._fail(obs)
        return obs

    def _fail(self, obs):
        mode = self.fail_mode
        if mode == 'raise':
            raise RuntimeError(
                f'Dummy: failing at step {self._count - 1} as asked '
                f'(fail_after {self.fail_after}).')
        if mode in ('segfault', 'kill'):
            signum = signal.SIGSEGV if mode == 'segfault' else signal.SIGKILL
            os.kill(os.getpid(), signum)
        if mode == 'dtype':
            return {**obs, 'image': obs['image'].astype(np.float32)}
        if mode == 'shape':
            return {**obs, 'image': obs['image'][:, :, :2]}
        if mode == 'nan':
            vector = obs['vector'].copy()
            vector[0] = np.nan
            return {**obs, 'vector': vector}
        return {k: v for k, v in obs.items() if k != 'vector'}

    def _movement(self, action):
        action = np.asarray(action)
        if self.task == 'disc':
            if action.shape != () or not 0 <= int(action) < DISC_CLASSES:
                raise ValueError(
                    f'Dummy action: expected an int in [0, {DISC_CLASSES}), '
                    f'got {action!r}.')
            return float(int(action) - (DISC_CLASSES - 1) / 2)
        if action.shape != (CONT_SIZE,):
            raise ValueError(
                f'Dummy action: expected shape ({CONT_SIZE},), '
                f'got {action.shape}.')
        return float(np.clip(action, -1, 1).mean())

    def _obs(self, reward, is_first=False, is_last=False):
        count = self._count
        self._count += 1
        vector = vector_for(count)
        return {
            'image': image_for(count, self.size),
            'vector': vector,
            'token': np.int32(count % TOKENS),
            'count': np.float32(count),
            'float2d': np.full((4, 5), vector[0], np.float32),
            'int2d': np.full((2, 3), count % INT2D_CLASSES, np.int32),
            'reward': np.float32(reward),
            'is_first': np.bool_(is_first),
            'is_last': np.bool_(is_last),
            'is_terminal': np.bool_(False),
            'log/player_pos': np.float32(self._position),
            'log/episode_step': np.int32(self._step),
        }
