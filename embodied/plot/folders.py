"""Run folders read as scores Records: each run's task, method and seed from
its folder's name in the sweep layout (`<index>-<task>-<method>-<seed>`, as
the original's plot.py reads them and `embodied.sweep.names` writes them),
else from its `config.yaml`."""

import pathlib

from . import runs as runslib
from . import scores

DEFAULT_METHOD = 'ours'


def parse_name(name):
    """(task, method, seed) of a folder named `<index>-<task>-<method>-<seed>`
    as `embodied.sweep` names its runs (a `-` of a task written `%2D`), or
    None."""
    from embodied.sweep import names
    return names.task_method_seed(name)


def identify(folder, method=None):
    """(task, method, seed) of a run folder: from its name in the sweep
    layout, else from the `task` and `seed` of its config.yaml (method:
    `method`, default 'ours'). `method` overrides either."""
    folder = pathlib.Path(folder)
    parsed = parse_name(folder.name)
    if parsed:
        task, found, seed = parsed
        return task, method or found, seed
    config = folder / 'config.yaml'
    if not config.exists():
        raise ValueError(
            f'{folder}: cannot tell its task and seed: the folder is not '
            f'named <index>-<task>-<method>-<seed> and has no config.yaml.')
    import elements
    values = elements.Config.load(str(config))
    return values['task'], method or DEFAULT_METHOD, values['seed']


def records(paths, key='episode/score', method=None):
    """Records of every run found under `paths` (`runs.find`): xs the env
    steps of its episodes, ys their `key`."""
    found = []
    for folder in runslib.find(paths):
        run = runslib.load(folder, key, label='-')
        task, name, seed = identify(folder, method)
        found.append(scores.Record(task, name, seed, run.steps, run.values))
    return found


def read_inputs(paths, key='episode/score', method=None):
    """Records of scores files and of run folders, in the order given."""
    found = []
    for path in paths:
        if str(path).endswith(scores.SUFFIX):
            loaded = scores.read(path)
            if method:
                for record in loaded:
                    record.method = method
            found.extend(loaded)
        else:
            found.extend(records([path], key, method))
    return found

