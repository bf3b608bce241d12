"""A corridor as an `embodied.Env`: walk right to the goal.

    PYTHONPATH=examples/own_env python -m embodied.main --configs debug \
        --script parallel --task corridor:Corridor --logdir logdir/corridor

The observation `vector` is the position and the time, both in [0, 1], and
whether a step left and a step right moves; the action is 0 (left) or 1
(right); reaching the right end gives reward 1 and ends the episode, which
is cut after `4 * length` steps.
"""

import elements
import numpy as np

import embodied


class Corridor(embodied.Env):

    def __init__(self, length=6):
        if length < 2:
            raise ValueError(f'length must be at least 2, got {length}')
        self.length = length
        self.limit = 4 * length
        self.position = 0
        self.time = 0
        self.done = True

    @property
    def obs_space(self):
        return {
            'vector': elements.Space(np.float32, (4,), 0, 1),
            'reward': elements.Space(np.float32),
            'is_first': elements.Space(bool),
            'is_last': elements.Space(bool),
            'is_terminal': elements.Space(bool),
        }

    @property
    def act_space(self):
        return {
            'action': elements.Space(np.int32, (), 0, 2),
            'reset': elements.Space(bool),
        }

    def step(self, action):
        if action['reset'] or self.done:
            self.position, self.time, self.done = 0, 0, False
            return self.observe(0.0, is_first=True)
        move = 1 if int(action['action']) == 1 else -1
        self.position = min(max(self.position + move, 0), self.length - 1)
        self.time += 1
        goal = self.position == self.length - 1
        self.done = goal or self.time >= self.limit
        return self.observe(
            float(goal), is_last=self.done, is_terminal=goal)

    def observe(self, reward, is_first=False, is_last=False,
                is_terminal=False):
        vector = np.array([
            self.position / (self.length - 1), self.time / self.limit,
            self.position > 0, self.position < self.length - 1], np.float32)
        return dict(
            vector=vector, reward=np.float32(reward), is_first=is_first,
            is_last=is_last, is_terminal=is_terminal)
