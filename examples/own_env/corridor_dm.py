"""The corridor of corridor.py as a dm_env environment.

    PYTHONPATH=examples/own_env python -m embodied.main --configs debug \
        --script parallel --task corridor_dm:Corridor --logdir logdir/dm
"""

import dm_env
from dm_env import specs
import numpy as np


class Corridor(dm_env.Environment):

    def __init__(self, length=6):
        if length < 2:
            raise ValueError(f'length must be at least 2, got {length}')
        self.length = length
        self.limit = 4 * length
        self.position = 0
        self.time = 0

    def observation_spec(self):
        return specs.BoundedArray((4,), np.float32, 0, 1, name='vector')

    def action_spec(self):
        return specs.DiscreteArray(2, name='action')

    def reset(self):
        self.position, self.time = 0, 0
        return dm_env.restart(self.observe())

    def step(self, action):
        move = 1 if int(action) == 1 else -1
        self.position = min(max(self.position + move, 0), self.length - 1)
        self.time += 1
        if self.position == self.length - 1:
            return dm_env.termination(1.0, self.observe())
        if self.time >= self.limit:
            return dm_env.truncation(0.0, self.observe())
        return dm_env.transition(0.0, self.observe())

    def observe(self):
        return np.array([
            self.position / (self.length - 1), self.time / self.limit,
            self.position > 0, self.position < self.length - 1], np.float32)
