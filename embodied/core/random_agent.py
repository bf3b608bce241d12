"""An agent that acts at random and learns nothing; for tests and baselines."""

import numpy as np

from . import base


class RandomAgent(base.Agent):
    """Samples every action uniformly from its space, batched.

    Bounded spaces are sampled uniformly; float dimensions with an infinite
    bound get a standard normal sample instead. Carries are empty tuples
    (`()`, as the original's), metrics are empty, and saving or loading does
    nothing.
    """

    def __init__(self, obs_space, act_space, config=None, seed=None):
        self.obs_space = obs_space
        self.act_space = {k: v for k, v in act_space.items() if k != 'reset'}
        self.rng = np.random.default_rng(seed)

    def init_policy(self, batch_size):
        return ()

    def init_train(self, batch_size):
        return ()

    def init_report(self, batch_size):
        return ()

    def policy(self, carry, obs, mode='train'):
        batch_size = len(obs['is_first'])
        act = {
            k: sample(space, batch_size, self.rng)
            for k, space in self.act_space.items()}
        return carry, act, {}

    def train(self, carry, data):
        return carry, {}, {}

    def report(self, carry, data):
        return carry, {}

    def stream(self, st):
        return st

    def save(self):
        return {}

    def load(self, data=None, regex=None):
        pass


def sample(space, batch_size, rng):
    """Draws `batch_size` values of `space`, stacked on a new first axis."""
    shape = (batch_size,) + space.shape
    if space.dtype == bool:
        return rng.integers(0, 2, shape).astype(bool)
    if np.issubdtype(space.dtype, np.integer):
        # Integer `high` is exclusive, except a default bound at the
        # dtype's maximum, which must stay reachable without overflow.
        low = np.broadcast_to(space.low, shape).astype(np.int64)
        high = np.broadcast_to(space.high, shape).astype(np.int64)
        top = np.iinfo(space.dtype).max
        highest = np.where(high >= top, top, high - 1)
        return rng.integers(low, highest, endpoint=True).astype(space.dtype)
    if np.issubdtype(space.dtype, np.floating):
        low = np.broadcast_to(space.low, shape)
        high = np.broadcast_to(space.high, shape)
        bounded = np.isfinite(low) & np.isfinite(high)
        uniform = rng.uniform(
            np.where(bounded, low, 0), np.where(bounded, high, 1))
        normal = rng.standard_normal(shape)
        return np.where(bounded, uniform, normal).astype(space.dtype)
    raise ValueError(f'RandomAgent: cannot sample from {space}.')
