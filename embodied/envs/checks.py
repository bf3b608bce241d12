"""What an env's spaces must hold for the agent and the runner to take them.

`check(env, where)` raises a UsageError naming the key and its space at the
first problem, when the run builds its first env (before any worker starts),
instead of a failure deep inside the agent, the replay or a worker later.
"""

import elements

from embodied.config import UsageError
from embodied.core import base

# Keys the runner adds to each step on its way to the agent and the replay.
RUNNER_KEYS = ('envid', 'is_eval', 'stepid', 'consec')
KINDS = 'biuf'  # bool, signed and unsigned integers, floats


def check(env, where):
    """Raises a UsageError starting with `where` unless the agent and the
    runner can take `env`'s observation and action spaces."""
    obs_space = _spaces(env, 'obs_space', where)
    act_space = _spaces(env, 'act_space', where)
    for role, spaces in (('obs', obs_space), ('act', act_space)):
        for key, space in spaces.items():
            _check_key(role, key, space, where)
    _check_step_keys(obs_space, act_space, where)
    shared = sorted(set(obs_space) & set(act_space))
    if shared:
        raise UsageError(
            f"{where}: key '{shared[0]}' is in both obs_space and act_space.")
    inputs = [k for k in obs_space
              if k not in base.step_spaces() and not k.startswith('log/')]
    if not inputs:
        raise UsageError(
            f'{where}: obs_space has no key for the agent besides reward, '
            f'is_first, is_last, is_terminal and log/ keys '
            f'(got {sorted(obs_space)}).')
    if not [k for k in act_space if k != 'reset']:
        raise UsageError(
            f"{where}: act_space has no key besides 'reset' for the agent to "
            f"act with.")


def _spaces(env, name, where):
    spaces = getattr(env, name)
    if not isinstance(spaces, dict):
        raise UsageError(
            f'{where}: {name} is a {type(spaces).__name__}, not a dict of '
            f'elements.Space.')
    return spaces


def _check_key(role, key, space, where):
    if not isinstance(key, str):
        raise UsageError(f'{where}: {role} key {key!r} is not a string.')
    if not isinstance(space, elements.Space):
        raise UsageError(
            f"{where}: {role} '{key}' is a {type(space).__name__}, not an "
            f"elements.Space.")
    if space.dtype.kind not in KINDS:
        raise UsageError(
            f"{where}: {role} '{key}' has {space}, of a dtype the agent "
            f"cannot take (bool, integer or float arrays).")
    if key in RUNNER_KEYS:
        raise UsageError(
            f"{where}: {role} '{key}' ({space}) is a key the runner adds to "
            f"every step ({', '.join(RUNNER_KEYS)}); rename it.")
    if role == 'act' and key.startswith('log/'):
        raise UsageError(
            f"{where}: act '{key}' ({space}): log/ keys are metrics of "
            f"observations, not actions.")


def _check_step_keys(obs_space, act_space, where):
    wanted = [('obs', obs_space, key, space)
              for key, space in base.step_spaces().items()]
    wanted.append(('act', act_space, 'reset', elements.Space(bool)))
    for role, spaces, key, expected in wanted:
        if key not in spaces:
            raise UsageError(
                f"{where}: {role} has no '{key}' ({expected}); every env's "
                f"observations hold reward, is_first, is_last and "
                f"is_terminal, its actions 'reset' (embodied.Env).")
        space = spaces[key]
        kind = 'f' if key == 'reward' else 'b'
        if space.dtype.kind != kind or space.shape != ():
            raise UsageError(
                f"{where}: {role} '{key}' has {space}, but '{key}' is the "
                f"step's own key and must be {expected}; give the env's "
                f"own '{key}' another name.")
