"""ProcGen: tasks `procgen_<game>`, e.g. `procgen_coinrun` (the 16 games of
OpenAI's Procgen Benchmark).

The games come from procgen-gym (the `procgen` extra), a maintained
gymnasium port of OpenAI's procgen, imported only when an env is built. It
has wheels for Python 3.13 and newer only; OpenAI's procgen package has
none for Python 3.11 or 3.12 that installs beside numpy 2 (docs/suites.md).
"""

import numpy as np

import elements

from embodied.core import base
from embodied.core import checks
from embodied.envs import packages

GAMES = (
    'bigfish', 'bossfight', 'caveflyer', 'chaser', 'climber', 'coinrun',
    'dodgeball', 'fruitbot', 'heist', 'jumper', 'leaper', 'maze', 'miner',
    'ninja', 'plunder', 'starpilot')
HOW = ('procgen-gym has wheels for Python >= 3.13 only '
       '(https://pypi.org/project/procgen-gym/).')


class ProcGen(base.Env):
    """One Procgen game from pixels, 15 discrete actions.

    At `size` (64, 64) the `image` is the game's own 64x64 observation;
    at any other size it is the game's 512x512 rendering resized with
    `resize` (`pillow` bilinear or `opencv` area), as in the original. The
    step that ends an episode shows the next episode's first frame (Procgen
    resets itself) and is terminal. `seed` seeds the levels (None: random);
    other keyword arguments go to the game (`distribution_mode`,
    `num_levels`, `start_level`, ...).
    """

    def __init__(self, task, size=(64, 64), resize='pillow', seed=None,
                 **kwargs):
        checks.choice('ProcGen', 'task', task, GAMES)
        checks.choice('ProcGen', 'resize', resize, ('pillow', 'opencv'))
        packages.need('procgen_gym', f'procgen_{task}', 'procgen',
                      package='procgen-gym', how=HOW)
        import gymnasium
        from embodied.envs import from_gym
        self._size = tuple(int(x) for x in size)
        self._resize = resize
        self._rendered = self._size != (64, 64)
        if self._rendered:
            kwargs['render_mode'] = 'rgb_array'
        if seed is not None:
            kwargs['rand_seed'] = int(seed) % 2 ** 31  # Procgen's is int32.
        env = gymnasium.make(f'procgen_gym/procgen-{task}-v0', **kwargs)
        self._env = from_gym.FromGym(env, obs_key='image')

    @property
    def obs_space(self):
        return {
            **self._env.obs_space,
            'image': elements.Space(np.uint8, self._size + (3,))}

    @property
    def act_space(self):
        return self._env.act_space

    def step(self, action):
        obs = self._env.step(action)
        if self._rendered:
            obs['image'] = self._resized(self._env.info['rgb'])
        return obs

    def close(self):
        self._env.close()

    def _resized(self, image):
        height, width = self._size
        if self._resize == 'opencv':
            import cv2
            return cv2.resize(
                image, (width, height), interpolation=cv2.INTER_AREA)
        from PIL import Image
        image = Image.fromarray(np.asarray(image))
        return np.asarray(image.resize((width, height), Image.BILINEAR))
