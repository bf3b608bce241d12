"""The corridor of corridor.py as a gymnasium env, also registered as the
gymnasium id `Corridor-v0` when this module is imported.

    PYTHONPATH=examples/own_env python -m embodied.main --configs debug \
        --script parallel --task corridor_gym:Corridor --logdir logdir/gym
    PYTHONPATH=examples/own_env python -m embodied.main --configs debug \
        --script parallel --task gym_corridor_gym:Corridor-v0 \
        --logdir logdir/id
"""

import gymnasium
import numpy as np


class Corridor(gymnasium.Env):

    def __init__(self, length=6, render_mode=None):
        if length < 2:
            raise ValueError(f'length must be at least 2, got {length}')
        self.length = length
        self.limit = 4 * length
        self.observation_space = gymnasium.spaces.Box(0, 1, (4,), np.float32)
        self.action_space = gymnasium.spaces.Discrete(2)
        self.position = 0
        self.time = 0

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.position, self.time = 0, 0
        return self.observe(), {}

    def step(self, action):
        move = 1 if int(action) == 1 else -1
        self.position = min(max(self.position + move, 0), self.length - 1)
        self.time += 1
        goal = self.position == self.length - 1
        truncated = not goal and self.time >= self.limit
        return self.observe(), float(goal), goal, truncated, {}

    def observe(self):
        return np.array([
            self.position / (self.length - 1), self.time / self.limit,
            self.position > 0, self.position < self.length - 1], np.float32)


gymnasium.register(id='Corridor-v0', entry_point=Corridor)
