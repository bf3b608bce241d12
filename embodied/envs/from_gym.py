"""Adapter from a gymnasium env to `embodied.Env`.

gymnasium is imported inside the constructor, so this module imports without
it. Dict spaces are flattened into keys joined by '/' (`{'a': {'b': ...}}`
becomes `a/b`); a flat space becomes the single key `obs_key` / `act_key`.
"""

import elements
import numpy as np

from embodied.envs import adapter

from embodied.envs.adapter import RESERVED_OBS


class FromGym(adapter.Adapter):
    """Wraps a gymnasium env, given as an instance or a `gymnasium.make` id.

    `terminated` maps to `is_terminal` (and `is_last`), `truncated` to
    `is_last` alone. `seed` seeds the first reset. With `render`, the env
    is made with `render_mode='rgb_array'` (an instance must have that
    mode) and each step's `render()`, resized to `render_size` (height,
    width; nearest pixel), goes to `log/image`: the logger and
    `run.eval_video` show it as episode videos, the agent never sees it.
    Extra keyword arguments go to `gymnasium.make`. The last step's info
    dict is kept in `self.info`.
    """

    def __init__(
            self, env, obs_key='vector', act_key='action', seed=None,
            render=False, render_size=(128, 192), **kwargs):
        import gymnasium
        self._spaces = gymnasium.spaces
        if isinstance(env, str):
            if render:
                kwargs.setdefault('render_mode', 'rgb_array')
            env = gymnasium.make(env, **kwargs)
        elif kwargs:
            raise TypeError(
                f'FromGym: keyword arguments {sorted(kwargs)} only apply when '
                f'env is an id string for gymnasium.make, got an instance.')
        self._render_size = None
        if render:
            self._render_size = _render_size(env, render_size)
        self._env = env
        self._seed = seed
        self._done = True
        self.info = {}
        self._obs_is_dict = isinstance(
            env.observation_space, self._spaces.Dict)
        self._act_is_dict = isinstance(env.action_space, self._spaces.Dict)
        self._obs_key = obs_key
        self._act_key = act_key
        self._gym_obs = self._flatten_space(env.observation_space, obs_key)
        self._gym_act = self._flatten_space(env.action_space, act_key)
        if 'reset' in self._gym_act:
            raise adapter.UnsupportedSpace(
                "FromGym: the env's action space has a key 'reset', which "
                "embodied reserves for starting an episode.")
        self._obs_names = {
            key: f'obs_{key}' if key in RESERVED_OBS else key
            for key in self._gym_obs}
        self._obs_space = {
            self._obs_names[key]: self._convert(key, space, 'observation')
            for key, space in self._gym_obs.items()}
        self._act_space = {
            key: self._convert(key, space, 'action')
            for key, space in self._gym_act.items()}
        if self._render_size:
            self._obs_space['log/image'] = elements.Space(
                np.uint8, (*self._render_size, 3))

    def step(self, action):
        if action['reset'] or self._done:
            obs, self.info = self._env.reset(seed=self._seed)
            self._seed = None  # Seed once; later resets continue the stream.
            self._done = False
            return self._obs(obs, 0.0, is_first=True)
        gym_action = self._gym_action(action)
        obs, reward, terminated, truncated, self.info = self._env.step(
            gym_action)
        self._done = bool(terminated or truncated)
        return self._obs(
            obs, reward, is_last=self._done, is_terminal=bool(terminated))

    def render(self):
        image = self._env.render()
        if image is None:
            raise RuntimeError(
                "FromGym.render: the env returned no image; create it with "
                "render_mode='rgb_array'.")
        return np.asarray(image)

    def _obs(self, obs, reward, is_first=False, is_last=False,
             is_terminal=False):
        flat = self._flatten_value(obs, self._obs_key, self._obs_is_dict)
        result = {}
        for key, space in self._gym_obs.items():
            name = self._obs_names[key]
            result[name] = self._from_gym(
                flat[key], space, self._obs_space[name].dtype)
        result.update(adapter.step_values(
            reward, is_first, is_last, is_terminal))
        if self._render_size:
            result['log/image'] = _resize(self.render(), self._render_size)
        return result

    def _gym_action(self, action):
        self._check_action(action)
        flat = {key: self._to_gym(action[key], space)
                for key, space in self._gym_act.items()}
        if not self._act_is_dict:
            return flat[self._act_key]
        return _unflatten(flat)

    def _flatten_space(self, space, key):
        if not isinstance(space, self._spaces.Dict):
            return {key: space}
        result = {}
        for name, sub in space.spaces.items():
            if isinstance(sub, self._spaces.Dict):
                sub = self._flatten_space(sub, None)
                result.update({f'{name}/{k}': v for k, v in sub.items()})
            else:
                result[name] = sub
        return result

    def _flatten_value(self, value, key, is_dict):
        if not is_dict:
            return {key: value}
        result = {}
        for name, sub in value.items():
            if isinstance(sub, dict):
                sub = self._flatten_value(sub, None, True)
                result.update({f'{name}/{k}': v for k, v in sub.items()})
            else:
                result[name] = sub
        return result

    def _convert(self, key, space, role):
        spaces = self._spaces
        if isinstance(space, spaces.Discrete):
            return elements.Space(np.int32, (), 0, int(space.n))
        if isinstance(space, spaces.MultiDiscrete):
            return elements.Space(
                np.int32, space.shape, 0, np.asarray(space.nvec, np.int64))
        if isinstance(space, spaces.MultiBinary):
            return elements.Space(np.int32, space.shape, 0, 2)
        if isinstance(space, spaces.Box):
            return _convert_box(space)
        raise adapter.UnsupportedSpace(
            f"FromGym: {role} '{key}' has a {type(space).__name__} space, "
            f"which has no embodied equivalent (supported: Box, Discrete, "
            f"MultiDiscrete, MultiBinary, Dict of these).")

    def _from_gym(self, value, space, dtype):
        value = np.asarray(value)
        start = getattr(space, 'start', None)
        if start is not None and not isinstance(space, self._spaces.Box):
            value = value - start
        return value.astype(dtype)

    def _to_gym(self, value, space):
        spaces = self._spaces
        value = np.asarray(value)
        if isinstance(space, spaces.Discrete):
            return int(value) + int(space.start)
        if isinstance(space, spaces.MultiDiscrete):
            return (value + space.start).astype(space.dtype)
        return value.astype(space.dtype).reshape(space.shape)


def _convert_box(space):
    dtype = np.dtype(space.dtype)
    if np.issubdtype(dtype, np.floating):
        return elements.Space(
            np.float32, space.shape,
            space.low.astype(np.float32), space.high.astype(np.float32))
    if dtype == bool:
        return elements.Space(bool, space.shape)
    if np.issubdtype(dtype, np.integer):
        # gymnasium's integer high is inclusive, embodied's is exclusive.
        target = np.uint8 if dtype == np.uint8 else np.int32
        info = np.iinfo(target)
        low = np.clip(space.low.astype(np.int64), info.min, info.max)
        high = np.clip(
            space.high.astype(np.int64) + 1, info.min, info.max + 1)
        return elements.Space(target, space.shape, low, high)
    raise adapter.UnsupportedSpace(
        f'FromGym: a Box space of dtype {dtype} has no embodied '
        f'equivalent.')


def _unflatten(flat):
    result = {}
    for key, value in flat.items():
        *parents, leaf = key.split('/')
        node = result
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return result


def _render_size(env, size):
    """(height, width) of the rendered frames, after checking that `env`
    renders arrays."""
    mode = getattr(env, 'render_mode', None)
    if mode != 'rgb_array':
        raise ValueError(
            f"FromGym: render=True needs an env with render_mode "
            f"'rgb_array', this one has {mode!r}.")
    size = tuple(int(x) for x in size)
    if len(size) != 2 or min(size) < 1:
        raise ValueError(
            f'FromGym: render_size must be (height, width), got {size}.')
    return size


def _resize(image, size):
    """`image` as uint8 RGB at `size` (height, width), nearest pixel."""
    image = np.asarray(image)
    if image.ndim == 2:
        image = image[..., None]
    if image.shape[-1] == 1:
        image = np.repeat(image, 3, -1)
    image = image[..., :3]
    if image.dtype != np.uint8:
        image = np.clip(image, 0, 255).astype(np.uint8)
    rows = (np.arange(size[0]) + 0.5) * image.shape[0] / size[0]
    cols = (np.arange(size[1]) + 0.5) * image.shape[1] / size[1]
    return image[rows.astype(int)][:, cols.astype(int)]
