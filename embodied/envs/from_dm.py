"""Adapter from a dm_env environment to `embodied.Env`.

dm_env and dm_control are imported only when needed, so this module imports
without them.
"""

import difflib

import elements
import numpy as np

from embodied.envs import adapter

from embodied.envs.adapter import RESERVED_OBS


class FromDM(adapter.Adapter):
    """Wraps a `dm_env.Environment`, or loads `domain_task` from dm_control.

    A LAST time step with discount 0 is terminal (`is_terminal`); any other
    LAST step only ends the episode (`is_last`). Observation keys with '/' get
    '_' instead, so that no env key can pose as a `log/` metric. Shapes with
    no elements are dropped. `seed` applies only when loading dm_control.
    """

    def __init__(self, env, obs_key='vector', act_key='action', seed=None):
        if isinstance(env, str):
            env = load_dm_control(env, seed)
        elif seed is not None:
            raise TypeError(
                'FromDM: seed only applies when env is a dm_control task '
                'name; seed an environment instance yourself.')
        self._env = env
        self._done = True
        obs_spec = env.observation_spec()
        act_spec = env.action_spec()
        self._obs_is_dict = isinstance(obs_spec, dict)
        self._act_is_dict = isinstance(act_spec, dict)
        self._obs_key = obs_key
        self._act_key = act_key
        obs_spec = dict(obs_spec) if self._obs_is_dict else {obs_key: obs_spec}
        act_spec = dict(act_spec) if self._act_is_dict else {act_key: act_spec}
        if 'reset' in act_spec:
            raise adapter.UnsupportedSpace(
                "FromDM: the env's action spec has a key 'reset', which "
                "embodied reserves for starting an episode.")
        self._obs_names = {
            key: _obs_name(key) for key, spec in obs_spec.items()
            if int(np.prod(spec.shape)) > 0}
        self._obs_space = {
            self._obs_names[key]: _convert(obs_spec[key], key, 'observation')
            for key in self._obs_names}
        self._act_spec = act_spec
        self._act_space = {
            key: _convert(spec, key, 'action')
            for key, spec in act_spec.items()}

    def step(self, action):
        if action['reset'] or self._done:
            time_step = self._env.reset()
        else:
            time_step = self._env.step(self._dm_action(action))
        self._done = time_step.last()
        return self._obs(time_step)

    def render(self):
        physics = getattr(self._env, 'physics', None)
        if physics is None:
            raise NotImplementedError(
                f'FromDM.render: {type(self._env).__name__} has no physics '
                f'to render.')
        return physics.render(64, 64, camera_id=0)

    def _obs(self, time_step):
        first = time_step.first()
        observation = time_step.observation
        if not self._obs_is_dict:
            observation = {self._obs_key: observation}
        result = {
            name: np.asarray(observation[key]).astype(
                self._obs_space[name].dtype)
            for key, name in self._obs_names.items()}
        reward = time_step.reward
        result.update(adapter.step_values(
            0.0 if first or reward is None else reward, first,
            time_step.last(), time_step.last() and time_step.discount == 0))
        return result

    def _dm_action(self, action):
        self._check_action(action)
        result = {
            key: np.asarray(action[key]).astype(spec.dtype).reshape(spec.shape)
            for key, spec in self._act_spec.items()}
        return result if self._act_is_dict else result[self._act_key]


def load_dm_control(name, seed=None):
    """Loads dm_control's suite task `domain_task`, e.g. `cartpole_balance`."""
    from dm_control import suite
    names = {f'{domain}_{task}': (domain, task)
             for domain, task in suite.ALL_TASKS}
    if name not in names:
        close = difflib.get_close_matches(name, sorted(names), n=3)
        hint = f" Close matches: {', '.join(close)}." if close else ''
        raise ValueError(f"Unknown dm_control task '{name}'.{hint}")
    domain, task = names[name]
    return suite.load(domain, task, task_kwargs={'random': seed})


def _obs_name(key):
    name = key.replace('/', '_')
    return f'obs_{name}' if name in RESERVED_OBS else name


def _convert(spec, key, role):
    """The `elements.Space` for a dm_env spec."""
    dtype = np.dtype(spec.dtype)
    if dtype.kind not in 'biuf':
        raise adapter.UnsupportedSpace(
            f"FromDM: {role} '{key}' has a spec of dtype {dtype} "
            f"({type(spec).__name__}), which has no embodied equivalent "
            f"(supported: bool, integer and float arrays).")
    if hasattr(spec, 'num_values'):
        return elements.Space(np.int32, (), 0, int(spec.num_values))
    if np.issubdtype(dtype, np.floating):
        dtype = np.float32
    low = getattr(spec, 'minimum', None)
    high = getattr(spec, 'maximum', None)
    if low is None:
        return elements.Space(dtype, spec.shape)
    if np.issubdtype(dtype, np.integer):
        # dm_env's integer maximum is inclusive, embodied's high is exclusive.
        high = np.asarray(high, np.int64) + 1
    return elements.Space(dtype, spec.shape, low, high)
