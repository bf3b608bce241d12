"""Your own environment, named on the command line as `--task module:attr`.

    python -m embodied.main --task corridor:Corridor --env.own.length 8

The run imports `module` (the run's working directory and PYTHONPATH are on
`sys.path`), calls `attr` (a class or factory) with the keyword arguments of
the config block `env.own`, and wraps what it returns: an `embodied.Env`
stays as it is, a gymnasium env goes through `FromGym`, a dm_env env through
`FromDM`.

The keys of `env.own` are the factory's keyword parameters whose defaults
are config values (bool, int, float, str, or a list of one of these), typed
by those defaults, so `--env.own.length 8` sets `length`, and a misspelt key
is an unknown flag. A parameter `seed` becomes the key `use_seed` (True: env
`i` gets its own seed, as in the built-in suites); `logdir` becomes
`use_logdir` (True: env `i` gets `LOGDIR/env<i>`). Other parameters keep
their defaults.

A task is `module:attr` when both parts are (dotted) Python names, unless it
reads as a built-in suite's `suite_rest` (`gym_mypkg.envs:Maze` is gymnasium's
`mypkg.envs:Maze` through the gym suite) and Python finds no module of the
whole name: a module `gym_tools` that Python finds makes `gym_tools:Maze`
your own env. Gymnasium ids with a version (`Maze-v0`) are no Python names,
so `gym_mypkg.envs:Maze-v0` is always the gym suite's.
"""

import importlib
import importlib.util
import inspect
import os
import re
import sys
import traceback

import elements

from embodied.config import UsageError
from embodied.core import importing

BLOCK = 'own'  # The config block of the factory's keys: env.own.
NAME = re.compile(r'[A-Za-z_]\w*(\.[A-Za-z_]\w*)*')
SPECIAL = {'seed': 'use_seed', 'logdir': 'use_logdir'}


def split(task):
    """(module, attr) of a task that has the form `module:attr`, else None."""
    module, sep, attr = task.partition(':')
    if sep and NAME.fullmatch(module) and NAME.fullmatch(attr):
        return module, attr
    return None


def is_own(task, suites):
    """Whether `task` names your own env rather than a suite in `suites`."""
    parts = split(task)
    if not parts:
        return False
    module = parts[0]
    prefix, sep, _ = module.partition('_')
    if not sep or prefix not in suites:
        return True
    return module_found(module)


def module_found(module):
    """Whether Python finds the top-level package of `module`, without
    importing it."""
    add_working_directory()
    try:
        return importlib.util.find_spec(module.split('.')[0]) is not None
    except (ImportError, ValueError):
        return False


def add_working_directory():
    """Puts the working directory on `sys.path` (last), as `python -m`
    does, also for the `embodied` command; spawned workers inherit it."""
    cwd = os.getcwd()
    if not any(os.path.abspath(p or '.') == cwd for p in sys.path):
        sys.path.append(cwd)


def import_module(module, task, reading=''):
    """Imports `module`, raising a UsageError that names it and why not;
    `reading` says how the task was read."""
    add_working_directory()
    try:
        return importlib.import_module(module)
    except Exception as e:
        missing = getattr(e, 'name', None)
        if isinstance(e, ModuleNotFoundError) and missing and (
                module == missing or module.startswith(missing + '.')):
            raise UsageError(
                f"--task {task}{reading}: no module '{missing}' in the "
                f"working directory ({os.getcwd()}) or on PYTHONPATH."
            ) from None
        raise UsageError(
            f"--task {task}{reading}: importing module '{module}' raised "
            f"{describe(e)}") from None


def load(task):
    """The class or factory that `task` (`module:attr`) names."""
    module, attr = split(task)
    try:
        value = importing.load(task, import_module(module, task))
    except importing.MissingAttribute as e:
        where = getattr(e.owner, '__file__', None) or getattr(
            e.owner, '__name__', e.part)
        raise UsageError(
            f"--task {task}: {where} has no attribute '{e.part}'"
            f"{_close(e.part, dir(e.owner))}.") from None
    if not callable(value):
        raise UsageError(
            f"--task {task}: {attr} is a {type(value).__name__}, not a "
            f"class or factory.")
    return value


def config_keys(factory, task):
    """The `env.own` block of `factory`: {key: default}."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return {}
    keys = {}
    for param in parameters:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if param.name in SPECIAL:
            keys[SPECIAL[param.name]] = True
        elif param.default is param.empty:
            raise UsageError(
                f"--task {task}: parameter '{param.name}' has no default; "
                f"give it one (the run passes keyword arguments from "
                f"env.{BLOCK}.<name>, typed by their defaults).")
        elif param.kind != param.POSITIONAL_ONLY and _is_config_value(
                param.default):
            default = param.default
            keys[param.name] = list(default) if isinstance(
                default, tuple) else default
    return keys


def with_keys(config, task):
    """`config` with the `env.own` keys of the factory that `task` names."""
    keys = config_keys(load(task), task)
    flat = {k: v for k, v in config.flat.items()
            if not k.startswith(f'env.{BLOCK}.')}
    flat.update({f'env.{BLOCK}.{k}': v for k, v in keys.items()})
    return elements.Config(flat)


def make(task, kwargs):
    """Calls the factory of `task` with `kwargs` and returns the env as an
    `embodied.Env`."""
    return adapt(call(load(task), task, kwargs=kwargs), task)


def call(factory, task, args=(), kwargs=None, name=None):
    """`factory(*args, **kwargs)`, raising a UsageError that names the call
    (`name`, else the factory's) and the error where it raises."""
    from embodied.envs import adapter
    kwargs = kwargs or {}
    try:
        return factory(*args, **kwargs)
    except adapter.UnsupportedSpace as e:
        raise UsageError(f'--task {task}: {e}') from None
    except UsageError:
        raise
    except Exception as e:
        if not name:
            shown = ', '.join([repr(x) for x in args] + [
                f'{k}={v!r}' for k, v in kwargs.items()])
            name = f"{getattr(factory, '__qualname__', factory)}({shown})"
        raise UsageError(
            f'--task {task}: {name} raised {describe(e)}') from None


def adapt(env, task):
    """`env` as an `embodied.Env`: as it is, or through the gymnasium or
    dm_env adapter."""
    from embodied.core import base
    if isinstance(env, base.Env):
        return env
    if hasattr(env, 'observation_space') and hasattr(env, 'action_space'):
        from embodied.envs.from_gym import FromGym as wrap
    elif hasattr(env, 'observation_spec') and hasattr(env, 'action_spec'):
        from embodied.envs.from_dm import FromDM as wrap
    else:
        raise UsageError(
            f'--task {task}: {split(task)[1]} returned an object of type '
            f'{type(env).__name__}, which is neither an embodied.Env, a '
            f'gymnasium env nor a dm_env env.')
    return call(wrap, task, (env,), name=f'{wrap.__name__}(env)')


def describe(error):
    """`Type: message (file:line)`, with the innermost line of the user's
    own code that the error passed through, if any."""
    text = f'{type(error).__name__}: {error}'
    if isinstance(error, SyntaxError):  # Its message names its line.
        return text
    frames = traceback.extract_tb(error.__traceback__)
    for frame in reversed(frames):
        if not _is_library(frame.filename):
            return f'{text} ({_short(frame.filename)}:{frame.lineno})'
    return text


def _is_library(path):
    """Whether `path` is in Python's own library, an installed package or
    embodied itself, not in the user's code."""
    import sysconfig
    import embodied
    path = os.path.abspath(path)
    folders = {sysconfig.get_path(name) for name in (
        'stdlib', 'platstdlib', 'purelib', 'platlib')}
    folders.add(os.path.dirname(os.path.abspath(embodied.__file__)))
    return path.startswith('<') or any(
        folder and path.startswith(folder + os.sep) for folder in folders)


def _short(path):
    relative = os.path.relpath(path)
    return path if relative.startswith('..') else relative


def _is_config_value(value):
    scalar = (bool, int, float, str)
    if isinstance(value, scalar):
        return True
    if isinstance(value, (list, tuple)) and value:
        return isinstance(value[0], scalar) and all(
            type(x) is type(value[0]) for x in value)
    return False


def _close(name, names):
    import difflib
    close = difflib.get_close_matches(name, names, n=1)
    return f"; did you mean '{close[0]}'?" if close else ''
