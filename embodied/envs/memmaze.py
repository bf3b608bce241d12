"""Memory Maze: tasks `memmaze_<size>` and `memmaze_<size>-<variant>`, as
the original's gym ids `MemoryMaze-<task>-v0` (sizes 9x9, 11x11, 13x13,
15x15; e.g. `memmaze_9x9`, `memmaze_15x15-HD`).

memory-maze is imported only when an env is built, through its dm_env
tasks: its package `__init__` also registers gym ids and fails without the
old `gym` package, which this adapter does not need.
"""

import importlib.util
import os
import sys
import types

from embodied.core import base
from embodied.envs import from_dm
from embodied.envs import packages

SIZES = ('9x9', '11x11', '13x13', '15x15')

# The keyword arguments memory-maze registers each gym id variant with.
VARIANTS = {
    '': dict(image_only_obs=True),
    'Vis': dict(image_only_obs=True, good_visibility=True),
    'HD': dict(image_only_obs=True, camera_resolution=256),
    'Top': dict(image_only_obs=True, camera_resolution=256, top_camera=True),
    'ExtraObs': dict(global_observables=True),
    'ExtraObs-Vis': dict(global_observables=True, good_visibility=True),
    'ExtraObs-Top': dict(
        global_observables=True, camera_resolution=256, top_camera=True),
    'Oracle': dict(
        image_only_obs=True, global_observables=True, show_path=True),
    'Oracle-Top': dict(
        image_only_obs=True, global_observables=True, show_path=True,
        camera_resolution=256, top_camera=True),
    'Oracle-ExtraObs': dict(global_observables=True, show_path=True),
    'HiFreq': dict(image_only_obs=True, control_freq=40),
    'HiFreq-Vis': dict(
        image_only_obs=True, control_freq=40, good_visibility=True),
    'HiFreq-HD': dict(
        image_only_obs=True, control_freq=40, camera_resolution=256),
    '6CL': dict(randomize_colors=True, image_only_obs=True),
    '6CL-Top': dict(
        randomize_colors=True, image_only_obs=True, camera_resolution=256,
        top_camera=True),
    '6CL-ExtraObs': dict(randomize_colors=True, global_observables=True),
}


class MemMaze(base.Env):
    """A Memory Maze task: find the target whose colour the image's border
    shows, in a 3-D maze of rooms, from the first-person `image` (uint8
    64x64x3, or 256x256x3 for the HD and Top variants). Six discrete
    actions (noop, forward, left, right, forward-left, forward-right); the
    ExtraObs variants add the maze layout and positions as vectors. An
    episode ends at the time limit (1000 steps for 9x9, up to 4000 for
    15x15) and is never terminal. `seed` seeds the mazes (None: random).
    """

    def __init__(self, task, seed=None):
        size, _, variant = task.partition('-')
        if size not in SIZES or variant not in VARIANTS:
            names = ', '.join(
                f'{s}-{v}' if v else s for s in SIZES[:1] for v in VARIANTS)
            raise ValueError(
                f"Unknown Memory Maze task '{task}': a size of "
                f"{', '.join(SIZES)}, optionally with a variant as in "
                f"{names}.")
        os.environ.setdefault('MUJOCO_GL', 'egl')
        tasks = _tasks(task)
        make = getattr(tasks, f'memory_maze_{size}')
        self._env = from_dm.FromDM(
            make(seed=seed, **VARIANTS[variant]), obs_key='image')

    @property
    def obs_space(self):
        return self._env.obs_space

    @property
    def act_space(self):
        return self._env.act_space

    def step(self, action):
        return self._env.step(action)

    def close(self):
        self._env.close()


def _tasks(task):
    """memory_maze.tasks, imported without the package's gym registration
    where the old gym package is missing."""
    if 'memory_maze.tasks' in sys.modules:
        return sys.modules['memory_maze.tasks']
    spec = importlib.util.find_spec('memory_maze')
    if spec is None:
        packages.need('memory_maze', f'memmaze_{task}', 'memmaze',
                      package='memory-maze')
    if importlib.util.find_spec('gym') is None:
        package = types.ModuleType('memory_maze')
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = spec
        sys.modules['memory_maze'] = package
    return importlib.import_module('memory_maze.tasks')
