"""A fast synthetic environment for tests and benchmarks.

Every observation carries `count`, the number of steps this env instance has
produced since it was constructed (0, 1, 2, ..., continuing across episodes).
The image and vector are deterministic functions of that count (`image_for`,
`vector_for`), so a consumer far downstream (the test agent, a replay test) can
check that each step arrived intact and in order.
"""

import elements
import numpy as np

from embodied.core import base

TASKS = ('disc', 'cont')
VECTOR_SIZE = 8
DISC_CLASSES = 4
CONT_SIZE = 2


def image_for(count, size):
    """The image shown at `count`: uint8, shape count.shape + size + (3,)."""
    count = np.asarray(count, np.int64)[..., None, None, None]
    height, width = size
    y = np.arange(height)[:, None, None]
    x = np.arange(width)[None, :, None]
    channel = np.arange(3)[None, None, :]
    # Position-dependent so that a transposed or shifted image is caught too.
    return ((count + 3 * y + 5 * x + 7 * channel) % 256).astype(np.uint8)


def vector_for(count):
    """The vector shown at `count`: float32 in [-1, 1), shape (..., 8)."""
    count = np.asarray(count, np.int64)[..., None]
    offsets = 37 * np.arange(VECTOR_SIZE)
    return (((count + offsets) % 1000) / 500 - 1).astype(np.float32)


class Dummy(base.Env):
    """Dummy env with a discrete (`disc`) or continuous (`cont`) action.

    Episodes last `length` steps after the reset step and end with `is_last`
    (never `is_terminal`). Reward is 1 on every step but the first.
    """

    def __init__(self, task, size=(64, 64), length=100):
        if task not in TASKS:
            raise ValueError(
                f"Unknown Dummy task '{task}': choose one of "
                f"{', '.join(TASKS)}.")
        size = tuple(size)
        if len(size) != 2 or not all(
                isinstance(s, (int, np.integer)) and s > 0 for s in size):
            raise ValueError(
                f'Dummy size must be two positive ints (height, width), '
                f'got {size}.')
        if not isinstance(length, (int, np.integer)) or length < 1:
            raise ValueError(
                f'Dummy length must be a positive int, got {length!r}.')
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
            'count': elements.Space(np.int32, (), 0),
            'reward': elements.Space(np.float32),
            'is_first': elements.Space(bool),
            'is_last': elements.Space(bool),
            'is_terminal': elements.Space(bool),
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
            return self._obs(reward=0.0, is_first=True)
        self._position += self._movement(action['action'])
        self._step += 1
        self._done = self._step >= self.length
        return self._obs(reward=1.0, is_last=self._done)

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
        return {
            'image': image_for(count, self.size),
            'vector': vector_for(count),
            'count': np.int32(count),
            'reward': np.float32(reward),
            'is_first': np.bool_(is_first),
            'is_last': np.bool_(is_last),
            'is_terminal': np.bool_(False),
            'log/player_pos': np.float32(self._position),
            'log/episode_step': np.int32(self._step),
        }
