"""The interfaces every agent, environment and data stream implements.

Agents are batched and functional: every method takes the carry it returned
before and gives back a new one. A carry is a tree (dict) whose leaves hold one
entry per example along the first axis. The parallel actor keeps one carry per
environment, so the carry that `policy()` receives may have *list* leaves (one
per-example entry each); an agent must accept both forms, and each leaf it
returns must be indexable by example (an array with a batch axis, or a list).
"""

import elements
import numpy as np

Space = elements.Space


def step_spaces():
    """The observation spaces every env has besides its own keys."""
    return {
        'reward': Space(np.float32),
        'is_first': Space(bool),
        'is_last': Space(bool),
        'is_terminal': Space(bool),
    }


def discrete_act_space(actions):
    """The action space of an env with `actions` discrete actions."""
    return {
        'action': Space(np.int32, (), 0, actions),
        'reset': Space(bool),
    }


class Agent:

    banner = []

    def __init__(self, obs_space, act_space, config):
        pass

    def init_policy(self, batch_size):
        raise NotImplementedError('init_policy(batch_size) -> carry')

    def init_train(self, batch_size):
        raise NotImplementedError('init_train(batch_size) -> carry')

    def init_report(self, batch_size):
        raise NotImplementedError('init_report(batch_size) -> carry')

    def policy(self, carry, obs, mode='train'):
        raise NotImplementedError(
            "policy(carry, obs, mode) -> carry, act, out")

    def train(self, carry, data):
        raise NotImplementedError(
            "train(carry, data) -> carry, out, metrics "
            "(out['replay'], if present, is written back to the replay)")

    def report(self, carry, data):
        raise NotImplementedError('report(carry, data) -> carry, metrics')

    def stream(self, st):
        raise NotImplementedError('stream(st) -> st')

    def save(self):
        raise NotImplementedError('save() -> data')

    def load(self, data, regex=None):
        raise NotImplementedError('load(data, regex=None) -> None')


class Env:
    """One environment. `step({'reset': True, ...})` starts an episode.

    Observations always hold `reward`, `is_first`, `is_last`, `is_terminal`;
    actions always hold `reset`. Keys that start with `log/` are metrics for the
    logger and never reach the agent or the replay.
    """

    def __repr__(self):
        return (
            f'{self.__class__.__name__}('
            f'obs_space={self.obs_space}, '
            f'act_space={self.act_space})')

    @property
    def obs_space(self):
        raise NotImplementedError('obs_space -> dict[str, Space]')

    @property
    def act_space(self):
        raise NotImplementedError('act_space -> dict[str, Space]')

    def step(self, action):
        raise NotImplementedError('step(action) -> obs')

    def render(self):
        raise NotImplementedError('render() -> image')

    def close(self):
        pass


class Wrapper:
    """Forwards everything it does not override to the wrapped env."""

    def __init__(self, env):
        self.env = env

    def __getattr__(self, name):
        if name.startswith('__'):
            raise AttributeError(name)
        return getattr(self.env, name)


def fill(batch, out):
    """`batch` copied into the arrays `out` and `out` returned, where both
    have the same keys, shapes and dtypes; else `batch` as it is."""
    if not isinstance(batch, dict) or batch.keys() != out.keys() or any(
            np.shape(value) != out[key].shape or
            np.asarray(value).dtype != out[key].dtype
            for key, value in batch.items()):
        return batch
    for key, value in batch.items():
        np.copyto(out[key], value)
    return out


class Stream:
    """An iterator of batches that can be checkpointed."""

    def __iter__(self):
        return self

    def __next__(self):
        raise NotImplementedError('__next__() -> batch')

    def layout(self):
        """`(key, dtype.str, shape)` of each array of the next batch when
        `next_into` can make it in place, with one copy from the source;
        None (here) when it cannot."""
        return None

    def next_into(self, out):
        """The next batch written into the arrays `out` (a dict, e.g. views
        of a shared-memory slot), and then `out` itself; the batch as `next`
        gives it where it does not fit `out`. Here the fallback: the batch
        is made, then copied (`fill`)."""
        return fill(next(self), out)

    def save(self):
        raise NotImplementedError('save() -> data')

    def load(self, data):
        raise NotImplementedError('load(data) -> None')
