"""DeepMind Control Suite from pixels: tasks `dmc_<domain>_<task>`.

dm_control is imported only when an env is built. Rendering is headless: if
`MUJOCO_GL` is unset it defaults to `egl` (software rendering through Mesa's
libEGL works without a GPU); set `MUJOCO_GL=osmesa` where only OSMesa exists.
"""

import os

import elements
import numpy as np

from embodied.core import base
from embodied.core import wrappers

from . import from_dm

STEP_KEYS = ('reward', 'is_first', 'is_last', 'is_terminal')


class DMC(base.Env):
    """A dm_control task with its camera image and, optionally, its proprio
    vectors as observations.

    `env` is a task name (`walker_walk`, `cup_catch` for ball_in_cup,
    `manip_<task>` for dm_control.manipulation's vision tasks, `rodent_<task>`
    for the locomotion rodent tasks) or a dm_env environment with `physics`.
    `repeat` repeats each action and sums the rewards. `size` is the rendered
    image's (height, width). `proprio` keeps the task's own observation
    vectors. `image=False` moves the image to `log/image`, where it reaches
    the logger (as episode videos) but not the agent. `camera=-1` picks the
    domain's default camera (2 for quadruped, 4 for rodent, else 0). `seed`
    seeds the task's random state (None: random).
    """

    DEFAULT_CAMERAS = dict(quadruped=2, rodent=4)

    def __init__(
            self, env, repeat=1, size=(64, 64), proprio=True, image=True,
            camera=-1, seed=None):
        os.environ.setdefault('MUJOCO_GL', 'egl')
        if isinstance(env, str):
            domain = env.split('_', 1)[0]
            if camera == -1:
                camera = self.DEFAULT_CAMERAS.get(domain, 0)
            env = load(env, seed)
        elif camera == -1:
            camera = 0
        if not hasattr(env, 'physics'):
            raise TypeError(
                f'DMC: the env {type(env).__name__} has no physics to render '
                f'images from.')
        self._dmenv = env
        self._size = tuple(int(x) for x in size)
        if len(self._size) != 2:
            raise ValueError(f'DMC: size must be (height, width), got {size}.')
        self._proprio = proprio
        self._image_key = 'image' if image else 'log/image'
        self._camera = camera
        self._env = wrappers.ActionRepeat(from_dm.FromDM(env), repeat)
        spaces = dict(self._env.obs_space)
        if not proprio:
            spaces = {k: spaces[k] for k in STEP_KEYS}
        spaces[self._image_key] = elements.Space(np.uint8, self._size + (3,))
        self._obs_space = spaces

    @property
    def obs_space(self):
        return self._obs_space

    @property
    def act_space(self):
        return self._env.act_space

    def step(self, action):
        for key, space in self._env.act_space.items():
            if not space.discrete and not np.isfinite(action[key]).all():
                raise ValueError(
                    f'DMC: action {key!r} is not finite: {action[key]}.')
        obs = self._env.step(action)
        if not self._proprio:
            obs = {k: obs[k] for k in STEP_KEYS}
        obs[self._image_key] = self.render()
        return obs

    def render(self):
        """The current frame from the configured camera, uint8 (H, W, 3)."""
        return self._dmenv.physics.render(*self._size, camera_id=self._camera)

    def close(self):
        self._env.close()


def load(name, seed=None):
    """Loads a dm_control task by the original's `domain_task` name."""
    domain, task = name.split('_', 1) if '_' in name else (name, '')
    if domain == 'manip':
        from dm_control import manipulation
        return manipulation.load(task + '_vision', seed=seed)
    if domain == 'rodent':
        from dm_control.locomotion.examples import basic_rodent_2020
        # The module's functions are named rodent_<task>.
        for fn in (f'rodent_{task}', task):
            if fn != 'rodent' and hasattr(basic_rodent_2020, fn):
                return getattr(basic_rodent_2020, fn)(random_state=seed)
        raise ValueError(f"Unknown dm_control rodent task '{task}'.")
    if domain == 'cup':  # The only domain whose name has an underscore.
        name = f'ball_in_cup_{task}'
    return from_dm.load_dm_control(name, seed)
