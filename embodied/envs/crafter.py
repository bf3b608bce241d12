"""Crafter: tasks `crafter_reward` and `crafter_noreward`.

crafter is imported only when an env is built.
"""

import json

import elements
import numpy as np

from embodied.core import base
from embodied.envs import adapter

TASKS = ('reward', 'noreward')


class Crafter(base.Env):
    """The Crafter survival game from pixels, 17 discrete actions.

    `crafter_noreward` gives reward 0; both tasks report the game's reward
    as `log/reward`. With `logs`, the episode's achievement counts are
    observed as `log/achievement_<name>` (int32). `log/` keys reach the
    logger as episode metrics, never the agent or the replay. With `logdir`,
    each finished episode appends its length, reward and achievements to
    `logdir/stats.jsonl` (the format of Crafter's own stats).
    """

    def __init__(self, task, size=(64, 64), logs=False, logdir=None,
                 seed=None):
        if task not in TASKS:
            raise ValueError(
                f"Unknown Crafter task '{task}': choose crafter_reward or "
                f"crafter_noreward.")
        import crafter
        self._env = crafter.Env(
            size=tuple(size), reward=(task == 'reward'), seed=seed)
        self._logs = logs
        self._logdir = logdir and elements.Path(logdir)
        if self._logdir:
            self._logdir.mkdir()
        self._achievements = list(crafter.constants.achievements)
        self._episode = 0
        self._length = None
        self._reward = None
        self._done = True

    @property
    def obs_space(self):
        spaces = {
            'image': elements.Space(
                np.uint8, tuple(
                    int(x) for x in self._env.observation_space.shape)),
            **base.step_spaces(),
            'log/reward': elements.Space(np.float32),
        }
        if self._logs:
            spaces.update({
                f'log/achievement_{name}': elements.Space(np.int32)
                for name in self._achievements})
        return spaces

    @property
    def act_space(self):
        return {
            'action': elements.Space(
                np.int32, (), 0, self._env.action_space.n),
            'reset': elements.Space(bool),
        }

    def step(self, action):
        if action['reset'] or self._done:
            self._episode += 1
            self._length = 0
            self._reward = 0.0
            self._done = False
            image = self._env.reset()
            return self._obs(image, 0.0, None, is_first=True)
        image, reward, self._done, info = self._env.step(
            int(action['action']))
        self._reward += info['reward']  # The task's reward, also for noreward.
        self._length += 1
        if self._done and self._logdir:
            self._write_stats(info)
        return self._obs(
            image, reward, info, is_last=self._done,
            is_terminal=info['discount'] == 0)

    def render(self):
        return self._env.render()

    def _obs(self, image, reward, info, is_first=False, is_last=False,
             is_terminal=False):
        obs = {
            'image': np.ascontiguousarray(image),  # Crafter's is transposed.
            **adapter.step_values(reward, is_first, is_last, is_terminal),
            'log/reward': np.float32(info['reward'] if info else 0.0),
        }
        if self._logs:
            for name in self._achievements:
                count = info['achievements'][name] if info else 0
                obs[f'log/achievement_{name}'] = np.int32(count)
        return obs

    def _write_stats(self, info):
        stats = {
            'episode': self._episode,
            'length': self._length,
            'reward': round(float(self._reward), 1),
            **{f'achievement_{name}': int(count)
               for name, count in info['achievements'].items()},
        }
        with (self._logdir / 'stats.jsonl').open('a') as f:
            f.write(json.dumps(stats) + '\n')
