"""LocoNav: a legged walker finds the goal in a maze of coloured walls;
tasks `loconav_<walker>_<maze>` with walker `ant` or `quadruped` and maze
`maze_s`, `maze_m`, `maze_l`, `maze_xl`, `maze_xxl` or `empty`, e.g.
`loconav_ant_maze_m`; a suffix `_<n>hz` sets the control rate (50 Hz).

dm_control (the `loconav` extra) is imported only when an env is built.
Rendering is headless as for DeepMind Control (`MUJOCO_GL`, see dmc.py).
"""

import os

import elements
import numpy as np

from embodied.core import base
from embodied.envs import loconav_mazes
from embodied.envs import packages

WALKERS = ('ant', 'quadruped')
TIME_LIMIT = 60  # Seconds of simulated time per episode.


class LocoNav(base.Env):
    """A walker in one of the fixed mazes, rewarded for reaching the goal
    sphere (1.2 m radius) placed at the maze's `G`, from a spawn at `P`
    with a random heading.

    The agent observes the walker's proprio vectors; the `camera` image
    (-1: 4 for the ant, 5 for the quadruped: a camera that follows it)
    goes to `log/image`, for episode videos only. `log/coverage` counts the
    distinct 1 m cells the walker has visited this episode. `repeat`
    repeats each action and sums the rewards.

    Without `again`, reaching the goal gives a reward of 1 on that step
    and every step after it until the episode ends (the goal stays where
    it is); with `again`, each reach gives 1 and respawns the walker, up
    to 1000 times. Episodes last 60 s of simulated time (3000 steps at
    50 Hz); with `termination`, an upside-down walker ends it. `weaker`
    scales every action. `seed` seeds the spawn heading and the task's
    randomness (None: random).
    """

    DEFAULT_CAMERAS = dict(ant=4, quadruped=5)

    def __init__(
            self, name, repeat=1, size=(64, 64), camera=-1, again=False,
            termination=False, weaker=1.0, seed=None):
        name, freq = _rate(name)
        walker_name, _, maze = name.partition('_')
        if walker_name not in WALKERS or maze not in loconav_mazes.MAPS:
            raise ValueError(
                f"Unknown LocoNav task '{name}': a walker of "
                f"{', '.join(WALKERS)} and a maze of "
                f"{', '.join(loconav_mazes.MAPS)}, e.g. ant_maze_m.")
        os.environ.setdefault('MUJOCO_GL', 'egl')
        packages.need('dm_control', f'loconav_{name}', 'loconav',
                      package='dm_control')
        from dm_control import composer
        from dm_control.locomotion.props import target_sphere
        from embodied.envs import dmc
        if camera == -1:
            camera = self.DEFAULT_CAMERAS[walker_name]
        random = np.random.RandomState(seed)
        self._walker = _walker(walker_name)
        task = _task(
            self._walker, loconav_mazes.arena(maze, random),
            target_sphere.TargetSphere(radius=1.2, height_above_ground=0.0),
            again, termination, freq)
        env = composer.Environment(
            time_limit=TIME_LIMIT, task=task, random_state=random,
            strip_singleton_obs_buffer_dim=True)
        self._env = dmc.DMC(env, repeat, size=size, camera=camera, image=False)
        self._weaker = weaker
        self._visited = set()

    @property
    def obs_space(self):
        return {
            **self._env.obs_space,
            'log/coverage': elements.Space(np.int32, (), -1, 2 ** 31 - 1)}

    @property
    def act_space(self):
        return self._env.act_space

    def step(self, action):
        action = dict(action)
        action['action'] = np.asarray(action['action']) * self._weaker
        obs = self._env.step(action)
        if obs['is_first']:
            self._visited = set()
        physics = self._env._dmenv.physics
        position = self._walker.get_pose(physics)[0].reshape(-1)[:2]
        self._visited.add(tuple(np.round(position).astype(int).tolist()))
        obs['log/coverage'] = np.int32(len(self._visited))
        return obs

    def render(self):
        return self._env.render()

    def close(self):
        self._env.close()


def _rate(name):
    """The task name without a `_<n>hz` suffix, and the control rate."""
    head, _, tail = name.rpartition('_')
    if head and tail.endswith('hz') and tail[:-2].isdigit():
        return head, int(tail[:-2])
    return name, 50


def _walker(name):
    if name == 'ant':
        from dm_control.locomotion.walkers import ant
        return ant.Ant()
    from embodied.envs import loconav_quadruped
    return loconav_quadruped.Quadruped()


def _task(walker, arena, target, again, termination, freq):
    from dm_control.locomotion.tasks import random_goal_maze

    class OneGoal(random_goal_maze.RepeatSingleGoalMaze):
        """Rewards every step from the first reach of the goal on, with no
        respawn (the original's LocoNav without `again`)."""

        def after_step(self, physics, random_state):
            random_goal_maze.NullGoalMaze.after_step(
                self, physics, random_state)
            self._rewarded_this_step = self._target.activated
            self._targets_obtained = int(self._target.activated)

    kind = random_goal_maze.RepeatSingleGoalMaze if again else OneGoal
    return kind(
        walker=walker, maze_arena=arena, target=target,
        max_repeats=1000 if again else 1, randomize_spawn_rotation=True,
        target_reward_scale=1.0,
        aliveness_threshold=-0.5 if termination else -1.0,
        contact_termination=False,
        physics_timestep=min(1 / freq / 4, 0.02), control_timestep=1 / freq)
