"""Atari 2600 games on the Arcade Learning Environment: tasks `atari_<game>`
and `atari100k_<game>` (the same env with the atari100k config block).

ale-py (>= 0.9 ships the ROMs) is imported only when an env is built. Set
`ALE_ROM_PATH` to a folder of `<game>.bin` files to use other ROMs.
"""

import collections
import difflib
import os
import threading

import elements
import numpy as np

from embodied.core import base, checks
from embodied.envs import adapter

NOOP, FIRE, UP = 0, 1, 2  # ALE's action numbers.


class Atari(base.Env):
    """One Atari game with the original's preprocessing.

    Each step repeats the action `repeat` times (frame skip) and returns the
    pixel-wise `aggregate` (max or mean) of the last `pooling` frames, resized
    to `size` (height, width) with `resize` (`pillow` bilinear or `opencv`
    area) and, with `gray`, turned into luminance. A reset takes a random
    number of up to `noops` no-op actions, then FIRE and UP with `autostart`.

    `lives`: `unused` ignores lives; `discount` marks the step that loses a
    life terminal (`is_terminal`, no bootstrapping) but continues the
    episode; `reset` ends the episode there. An episode also ends at game
    over and after `length` frames (not terminal). `sticky` repeats the
    previous action with probability 0.25 in the emulator. `actions`: `all`
    18 actions or the game's `needed` minimal set. `clip_reward` keeps the
    reward's sign.
    """

    LOCK = threading.Lock()  # ALE's ROM loading and reset are not threadsafe.
    WEIGHTS = np.array([0.299, 0.587, 1 - (0.299 + 0.587)])
    ACTION_MEANING = (
        'NOOP', 'FIRE', 'UP', 'RIGHT', 'LEFT', 'DOWN', 'UPRIGHT', 'UPLEFT',
        'DOWNRIGHT', 'DOWNLEFT', 'UPFIRE', 'RIGHTFIRE', 'LEFTFIRE', 'DOWNFIRE',
        'UPRIGHTFIRE', 'UPLEFTFIRE', 'DOWNRIGHTFIRE', 'DOWNLEFTFIRE')

    def __init__(
            self, name, repeat=4, size=(84, 84), gray=True, noops=0,
            lives='unused', sticky=True, actions='all', length=108000,
            pooling=2, aggregate='max', resize='pillow', autostart=False,
            clip_reward=False, seed=None):
        checks.choice('Atari', 'lives', lives, ('unused', 'discount', 'reset'))
        checks.choice('Atari', 'actions', actions, ('all', 'needed'))
        checks.choice('Atari', 'resize', resize, ('opencv', 'pillow'))
        checks.choice('Atari', 'aggregate', aggregate, ('max', 'mean'))
        checks.integers('Atari', 1, repeat=repeat, pooling=pooling)
        checks.integers('Atari', 0, noops=noops)
        size = tuple(int(x) for x in size)
        if len(size) != 2 or min(size) < 1:
            raise ValueError(
                f'Atari: size must be (height, width), got {size}.')
        if resize == 'opencv':
            import cv2  # Fail here rather than at the first step.
            self._cv2 = cv2
        if name == 'james_bond':
            name = 'jamesbond'
        self.repeat = int(repeat)
        self.size = size
        self.gray = gray
        self.noops = int(noops)
        self.lives = lives
        self.sticky = sticky
        self.length = length
        self.pooling = int(pooling)
        self.aggregate = aggregate
        self.resize = resize
        self.autostart = autostart
        self.clip_reward = clip_reward
        self.rng = np.random.default_rng(seed)

        import ale_py
        self._ale_py = ale_py
        rom = _rom_path(name)
        with self.LOCK:
            # Set before the first interface is made, which otherwise prints
            # the ALE banner in every env process.
            ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
            self.ale = ale_py.ALEInterface()
            self.ale.setInt('random_seed', int(self.rng.integers(0, 2 ** 31)))
            self.ale.setFloat(
                'repeat_action_probability', 0.25 if sticky else 0.0)
            self.ale.loadROM(rom)
        self.actionset = {
            'all': self.ale.getLegalActionSet,
            'needed': self.ale.getMinimalActionSet,
        }[actions]()
        height, width = self.ale.getScreenDims()
        self.buffers = collections.deque(
            [np.zeros((height, width, 3), np.uint8)
             for _ in range(self.pooling)], maxlen=self.pooling)
        self.prevlives = None
        self.duration = None
        self.done = True

    @property
    def obs_space(self):
        return {
            'image': elements.Space(
                np.uint8, (*self.size, 1 if self.gray else 3)),
            **base.step_spaces(),
        }

    @property
    def act_space(self):
        return base.discrete_act_space(len(self.actionset))

    def step(self, action):
        if action['reset'] or self.done:
            self._reset()
            self.prevlives = self.ale.lives()
            self.duration = 0
            self.done = False
            return self._obs(0.0, is_first=True)
        index = int(action['action'])
        if not 0 <= index < len(self.actionset):
            raise ValueError(
                f'Atari: action {index} is out of range for the '
                f'{len(self.actionset)} actions of this game.')
        act = self.actionset[index]
        reward = 0.0
        terminal = last = False
        for repeat in range(self.repeat):
            reward += self.ale.act(act)
            self.duration += 1
            if repeat >= self.repeat - self.pooling:
                self._render()
            if self.ale.game_over():
                terminal = last = True
            if self.duration >= self.length:
                last = True
            lives = self.ale.lives()
            if 0 < lives < self.prevlives:
                if self.lives == 'discount':
                    terminal = True
                elif self.lives == 'reset':
                    terminal = last = True
            self.prevlives = lives
            if terminal or last:
                break
        self.done = last
        return self._obs(reward, is_last=last, is_terminal=terminal)

    def close(self):
        pass

    def _reset(self):
        with self.LOCK:
            self.ale.reset_game()
        for _ in range(self.rng.integers(self.noops + 1)):
            self._act_or_reset(NOOP)
        if self.autostart and self._action(FIRE) in self.actionset:
            self._act_or_reset(FIRE)
            self._act_or_reset(UP)
        # Every pooled frame shows the first screen, so that the first
        # observation pools no frames of the previous episode.
        self._render()
        for buffer in list(self.buffers)[1:]:
            np.copyto(buffer, self.buffers[0])

    def _act_or_reset(self, number):
        self.ale.act(self._action(number))
        if self.ale.game_over():
            with self.LOCK:
                self.ale.reset_game()

    def _action(self, number):
        return self._ale_py.Action(number)

    def _render(self):
        self.buffers.appendleft(self.buffers.pop())
        self.ale.getScreenRGB(self.buffers[0])

    def _obs(self, reward, is_first=False, is_last=False, is_terminal=False):
        if self.clip_reward:
            reward = np.sign(reward)
        if self.aggregate == 'max':
            image = np.amax(self.buffers, 0)
        else:
            image = np.mean(self.buffers, 0).astype(np.uint8)
        height, width = self.size
        if self.resize == 'opencv':
            image = self._cv2.resize(
                image, (width, height), interpolation=self._cv2.INTER_AREA)
        else:
            from PIL import Image
            image = np.asarray(Image.fromarray(image).resize(
                (width, height), Image.BILINEAR))
        if self.gray:
            # Luminance weights: an equal average of the channels would make
            # e.g. pure red and pure green look the same.
            image = (image * self.WEIGHTS).sum(-1).astype(np.uint8)[..., None]
        return dict(image=image, **adapter.step_values(
            reward, is_first, is_last, is_terminal))


def _rom_path(name):
    folder = os.environ.get('ALE_ROM_PATH')
    if folder:
        path = os.path.join(folder, f'{name}.bin')
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"Atari: no ROM '{name}.bin' in ALE_ROM_PATH={folder}.")
        return path
    import ale_py.roms
    path = ale_py.roms.get_rom_path(name)
    if path is None:
        known = ale_py.roms.get_all_rom_ids()
        close = difflib.get_close_matches(name, known, n=3)
        hint = f" Close matches: {', '.join(close)}." if close else ''
        raise ValueError(f"Unknown Atari game '{name}'.{hint}")
    return path
