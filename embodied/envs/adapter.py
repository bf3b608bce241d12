"""What the adapters of other env APIs (gymnasium, dm_env) share."""

import elements
import numpy as np

from embodied.core import base

# Observation keys an adapter adds itself; an env key of the same name is
# renamed to `obs_<name>`.
RESERVED_OBS = ('reward', 'is_first', 'is_last', 'is_terminal')


class UnsupportedSpace(TypeError, ValueError):
    """An env's space that has no embodied equivalent, or a key that
    embodied reserves; the message names the key and the space."""


class Adapter(base.Env):
    """An `embodied.Env` over another API's env `self._env`, whose own keys
    are in `self._obs_space` and `self._act_space`; adds the step spaces
    and the `reset` action."""

    @property
    def env(self):
        """The wrapped environment."""
        return self._env

    @property
    def obs_space(self):
        return {**self._obs_space, **base.step_spaces()}

    @property
    def act_space(self):
        return {**self._act_space, 'reset': elements.Space(bool)}

    def close(self):
        self._env.close()

    def _check_action(self, action):
        """Raises a KeyError naming the first action key that is missing."""
        for key in self._act_space:
            if key not in action:
                raise KeyError(
                    f"{type(self).__name__}: action is missing key '{key}' "
                    f"(got {sorted(action)}).")


def step_values(reward, is_first, is_last, is_terminal):
    """The step keys of an observation, with the dtypes of their spaces."""
    return dict(
        reward=np.float32(reward), is_first=np.bool_(is_first),
        is_last=np.bool_(is_last), is_terminal=np.bool_(is_terminal))
