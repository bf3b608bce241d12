"""DeepMind Lab: tasks `dmlab_<level>` with the DMLab-30 level names, e.g.
`dmlab_explore_goal_locations_small`, `dmlab_rooms_watermaze`,
`dmlab_language_select_described_object`.

DeepMind Lab (`deepmind_lab`) has no package on PyPI, so no extra: it is
built from its source with Bazel and installed as a wheel. It is imported
only when an env is built.
"""

import functools
import re
import zlib

import elements
import numpy as np

from embodied.core import base
from embodied.core import checks
from embodied.envs import adapter
from embodied.envs import packages

HOW = ('DeepMind Lab is not on PyPI: build it from source with Bazel and '
       'pip install the wheel it builds: '
       'https://github.com/google-deepmind/lab/blob/master/docs/users/build.md')

# Each action: look left/right (pixels), look down/up, strafe left/right,
# move back/forward, fire, jump, crouch; DeepMind Lab's 7 action slots.
IMPALA_ACTIONS = (
    (0, 0, 0, 1, 0, 0, 0), (0, 0, 0, -1, 0, 0, 0),
    (0, 0, -1, 0, 0, 0, 0), (0, 0, 1, 0, 0, 0, 0),
    (-20, 0, 0, 0, 0, 0, 0), (20, 0, 0, 0, 0, 0, 0),
    (-20, 0, 0, 1, 0, 0, 0), (20, 0, 0, 1, 0, 0, 0),
    (0, 0, 0, 0, 1, 0, 0))
POPART_ACTIONS = (
    (0, 0, 0, 1, 0, 0, 0), (0, 0, 0, -1, 0, 0, 0),
    (0, 0, -1, 0, 0, 0, 0), (0, 0, 1, 0, 0, 0, 0),
    (-10, 0, 0, 0, 0, 0, 0), (10, 0, 0, 0, 0, 0, 0),
    (-60, 0, 0, 0, 0, 0, 0), (60, 0, 0, 0, 0, 0, 0),
    (0, 10, 0, 0, 0, 0, 0), (0, -10, 0, 0, 0, 0, 0),
    (-10, 0, 0, 1, 0, 0, 0), (10, 0, 0, 1, 0, 0, 0),
    (-60, 0, 0, 1, 0, 0, 0), (60, 0, 0, 1, 0, 0, 0),
    (0, 0, 0, 0, 1, 0, 0))
ACTION_SETS = {'impala': IMPALA_ACTIONS, 'popart': POPART_ACTIONS}

TOKENS = re.compile(r'([A-Za-z_]+|[^A-Za-z_ ]+)')
INSTR_LENGTH = 32     # Tokens of an instruction.
EMBED_SIZE = 32       # Floats per token.
VOCAB = 64 * 1024     # Hash buckets of the token embeddings.


class DMLab(base.Env):
    """One DMLab-30 level from pixels with a discrete action set.

    `actions`: `popart` (15 actions) or `impala` (9); each is repeated
    `repeat` frames. `image` is `size` (height, width) RGB. `mode`
    `train` plays a `_test` level's `_train` variant; `eval` allows the
    held-out levels with a fixed mixer seed. With `episodic`, the end of an
    episode is terminal. With `text` (default for the language levels),
    `instr` holds the instruction as 32 token embeddings of 32 floats
    (hashed tokens, a fixed random table). `seed` seeds the episode seeds.
    """

    def __init__(
            self, level, repeat=4, size=(64, 64), mode='train',
            actions='popart', episodic=True, text=None, seed=None):
        checks.choice('DMLab', 'mode', mode, ('train', 'eval'))
        checks.choice('DMLab', 'actions', actions, tuple(ACTION_SETS))
        lab = packages.need(
            'deepmind_lab', f'dmlab_{level}', None, how=HOW)
        if level == 'goals':  # The original's shortcut.
            level = 'explore_goal_locations_small'
        self._size = tuple(int(x) for x in size)
        self._repeat = int(repeat)
        self._actions = ACTION_SETS[actions]
        self._episodic = episodic
        self._text = level.startswith('language') if text is None else text
        self._rng = np.random.RandomState(seed)
        config = dict(height=self._size[0], width=self._size[1],
                      logLevel='WARN')
        if mode == 'train' and level.endswith('_test'):
            level = level[:-len('_test')] + '_train'
        if mode == 'eval':
            config.update(allowHoldOutLevels='true', mixerSeed=0x600D5EED)
        observations = ['RGB_INTERLEAVED'] + (['INSTR'] if self._text else [])
        self._env = lab.Lab(
            level='contributed/dmlab30/' + level, observations=observations,
            config={k: str(v) for k, v in config.items()})
        if self._text:
            self._table = np.random.default_rng(0).normal(
                0.0, 1.0, (VOCAB, EMBED_SIZE)).astype(np.float32)
        self._image = None
        self._instr = None
        self._done = True

    @property
    def obs_space(self):
        spaces = {
            'image': elements.Space(np.uint8, self._size + (3,)),
            **base.step_spaces()}
        if self._text:
            spaces['instr'] = elements.Space(
                np.float32, (INSTR_LENGTH * EMBED_SIZE,))
        return spaces

    @property
    def act_space(self):
        return base.discrete_act_space(len(self._actions))

    def step(self, action):
        if action['reset'] or self._done:
            self._env.reset(seed=self._rng.randint(0, 2 ** 31 - 1))
            self._done = False
            return self._obs(0.0, is_first=True)
        raw = np.array(self._actions[int(action['action'])], np.intc)
        reward = self._env.step(raw, num_steps=self._repeat)
        self._done = not self._env.is_running()
        return self._obs(reward, is_last=self._done)

    def close(self):
        self._env.close()

    def _obs(self, reward, is_first=False, is_last=False):
        if not self._done:  # A finished level has no observations.
            observations = self._env.observations()
            self._image = observations['RGB_INTERLEAVED']
            if self._text:
                self._instr = self._embed(observations['INSTR'])
        obs = {
            'image': self._image,
            **adapter.step_values(
                reward, is_first, is_last, is_last and self._episodic)}
        if self._text:
            obs['instr'] = self._instr
        return obs

    def _embed(self, text):
        ids = [_bucket(token) for token in TOKENS.findall(text.lower())]
        ids = (ids + [0] * INSTR_LENGTH)[:INSTR_LENGTH]
        return self._table[ids].reshape(-1)


@functools.lru_cache(maxsize=None)
def _bucket(token):
    return zlib.crc32(token.encode('utf-8')) % VOCAB
