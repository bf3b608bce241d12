"""A sweep's command line and its grid of runs.

The command line is `python -m embodied.main`'s, with

* `--logdir DIR`: the sweep's folder; each run's logdir is a folder below it
  named `<index>-<task>-<method>-<seed>` (`embodied.sweep.names`);
* `--task T ...`, `--seed S ...`, `--method M ...`: the tasks, seeds and
  methods (one value each, or several);
* `--grid.KEY V ...`: any other config key, one run per value. Each value is
  one word of the command line, passed whole as the run's `--KEY` value:
  nothing is split at commas (`--grid.jax.policy_mesh -1,1,1 1,-1,1` is two
  runs); a list key reads its word as `python -m embodied.main` reads it
  (`--grid.configs debug,size1m debug,size12m`, items split at commas);
* `--KEY V1 V2 ...` with several values, for a key holding one value (not a
  list such as `configs`), is the same as `--grid.KEY V1 V2 ...`;
* `--sweep.NAME VALUE`: the sweep's own options (`OPTIONS`);
* every other flag: passed to every run unchanged.

The grid is every combination: tasks outermost, the `--grid` keys in the
order given, seeds innermost. A run's method is `--method` (else the agent's
name: `dreamerv3`, `testing`, or the class of `--agent_impl module:Class`)
followed by `_KEY=VALUE` for each `--grid` key (the key's last part,
`train_ratio` for `run.train_ratio`, unless two swept keys share it), so
that runs with different values are told apart by the original's `plot.py`.
"""

import dataclasses
import itertools
import os
import pathlib
import shlex

from embodied import config as configlib
from embodied.config import UsageError
from embodied.sweep import names

# The sweep's own options: name -> (default, meaning).
OPTIONS = {
    'parallel': (0, 'runs at once: locally (0: 1), or the most array '
                    'elements running at once on Slurm (0: no limit)'),
    'scheduler': ('local', 'local: runs as child processes here; slurm: one '
                           'Slurm job array, an element per run'),
    'gpus': (1, 'GPUs each array element asks Slurm for (sbatch --gpus)'),
    'sbatch': ('', "more sbatch options for the array, one word (quoted: "
                   "'--time=24:00:00 --partition=gpu')"),
    'dry': (False, 'True: print the runs and their state, start nothing'),
}
SCHEDULERS = ('local', 'slurm')
SCRIPTS = ('train', 'train_eval', 'parallel')  # Scripts whose runs end.
# Keys that are always axes, set on every run by the sweep.
NAMED_AXES = ('task', 'seed', 'method')


class BadGrid(UsageError):
    """A sweep that cannot run as given; the message says why."""


@dataclasses.dataclass(frozen=True)
class Run:
    """One run of a sweep: `python -m embodied.main *argv`."""
    index: int
    task: str
    method: str
    seed: int
    logdir: pathlib.Path   # the run's folder, below the sweep's
    argv: tuple            # the flags of `python -m embodied.main`
    steps: int             # its run.steps
    values: tuple = ()     # (KEY, VALUE) of its --grid keys

    @property
    def name(self):
        return self.logdir.name


@dataclasses.dataclass
class Command:
    """A sweep's command line, taken apart (`split`)."""
    logdir: str
    flags: list            # passed to every run
    axes: dict             # key -> list of values (words), in order
    options: dict          # --sweep.NAME -> value


def split(argv):
    """Takes a sweep's command line apart into its logdir, the flags of
    every run, the axes and the sweep's options. Raises BadGrid."""
    entries = _entries(list(argv))
    defaults = configlib.build([]).flat
    logdir, flags, axes = None, [], {}
    options = {name: default for name, (default, _) in OPTIONS.items()}

    def add_axis(key, values, flag):
        if key in axes:
            raise BadGrid(f'{flag}: the key {key} is swept twice.')
        axes[key] = list(values)

    for flag, values, inline in entries:
        name = flag[2:]
        if not values:
            raise BadGrid(f'{flag} has no value: give it one or more.')
        if name.startswith('sweep.'):
            options[name[6:]] = _option(name[6:], values, flag)
        elif name.startswith('grid.'):
            key = name[5:]
            if key in ('logdir', 'sweep') or key.startswith(
                    ('grid.', 'sweep.')):
                raise BadGrid(f'{flag}: a sweep has one --logdir; the other '
                              f'keys of a run can be swept.')
            add_axis(key, values, flag)
        elif name == 'logdir':
            if len(values) != 1:
                raise BadGrid(
                    f'--logdir takes one folder (the sweep\'s), got '
                    f'{len(values)}: {" ".join(values)}')
            logdir = values[0]
        elif name in NAMED_AXES and not inline:
            add_axis(name, values, flag)
        elif (len(values) > 1 and name in defaults and
              not isinstance(defaults[name], (tuple, list))):
            add_axis(name, values, flag)
        else:
            flags.extend([flag] if inline else [flag, *values])
    if logdir is None:
        raise BadGrid('A sweep needs --logdir: the folder its runs go in '
                      '(the same folder resumes the sweep).')
    return Command(logdir, flags, axes, options)


def _entries(argv):
    """(flag, values, inline) for each flag of `argv` (`inline`: written
    `--flag=value`). The value after `--sweep.sbatch` is taken whole, as it
    starts with `--`."""
    entries = []
    while argv:
        arg = argv.pop(0)
        if not arg.startswith('--') or arg == '--':
            raise BadGrid(
                f"'{arg}' is not a flag: a sweep's command line is flags "
                f"and their values (--key value ...).")
        if '=' in arg:
            flag, value = arg.split('=', 1)
            entries.append((flag, [value], True))
            continue
        values = []
        if arg == '--sweep.sbatch' and argv:
            values.append(argv.pop(0))
        while argv and not argv[0].startswith('--'):
            values.append(argv.pop(0))
        entries.append((arg, values, False))
    return entries


def _option(name, values, flag):
    if name not in OPTIONS:
        raise BadGrid(f"Unknown sweep option {flag}: the options are "
                      f"{', '.join('--sweep.' + n for n in OPTIONS)}.")
    if len(values) != 1:
        raise BadGrid(f'{flag} takes one value, got {" ".join(values)}.')
    value = values[0]
    default = OPTIONS[name][0]
    if isinstance(default, bool):
        if value not in ('True', 'False'):
            raise BadGrid(f"{flag} is True or False, not '{value}'.")
        return value == 'True'
    if isinstance(default, int):
        if not value.isdigit():
            raise BadGrid(f"{flag} is a count (0 or more), not '{value}'.")
        return int(value)
    if name == 'scheduler' and value not in SCHEDULERS:
        raise BadGrid(f"{flag} is one of {', '.join(SCHEDULERS)}, not "
                      f"'{value}'.")
    return value


def sbatch_words(options):
    """The `--sweep.sbatch` option as sbatch's arguments."""
    try:
        return shlex.split(options['sbatch'])
    except ValueError as e:
        raise BadGrid(f'--sweep.sbatch: {e}.') from None


def plan(logdir, flags=(), tasks=None, seeds=None, grid=None, methods=None,
         blocks=None):
    """The runs of a sweep in `logdir`: every combination of `tasks`,
    `seeds`, `methods` (None: the config's) and the `grid` (key -> list of
    values, each a word as on the command line), each with `flags` (a list
    of `python -m embodied.main` flags) first. Each run's flags are
    checked as `python -m embodied.main` checks them. A run whose folder
    exists below `logdir` (same task, method and seed) keeps its folder;
    new runs take their place in the grid as index, or the next free one.
    Raises BadGrid, naming what is wrong, before anything is written."""
    axes = {}
    for key, values in (('task', tasks), ('seed', seeds),
                        ('method', methods)):
        if values is not None:
            axes[key] = values
    for key, values in (grid or {}).items():
        if key in axes:
            raise BadGrid(f'--grid.{key}: the key {key} is swept twice.')
        axes[key] = values
    return expand(Command(str(logdir), list(flags), axes, {}), blocks)


def expand(command, blocks=None):
    """The runs of a `Command` (see `plan`)."""
    from embodied import main
    sweepdir = _sweep_folder(command.logdir)
    for key, values in command.axes.items():
        if not values:
            raise BadGrid(f'--{key} lists no values: give one or more.')
        command.axes[key] = [str(value) for value in values]
    for flag in command.flags:
        name = flag[2:].split('=', 1)[0] if flag.startswith('--') else None
        if name in ('logdir', 'sweep') or (name or '').startswith('sweep.'):
            raise BadGrid(f'{flag} is not a flag of the runs: the sweep sets '
                          f'each run\'s --logdir.')
    blocks = blocks or configlib.load_blocks()
    order = (['task'] if 'task' in command.axes else []) + [
        key for key in command.axes if key not in ('task', 'seed')] + (
        ['seed'] if 'seed' in command.axes else [])
    swept = [key for key in order if key not in NAMED_AXES]
    labels = _labels(swept)
    runs, errors = [], []
    for position, combo in enumerate(itertools.product(
            *(command.axes[key] for key in order))):
        values = dict(zip(order, combo))
        argv = list(command.flags)
        for key in order:
            if key != 'method':  # Set below, with the grid's values.
                argv += [f'--{key}', values[key]]
        try:
            config = main.parse([*argv, '--logdir', str(sweepdir)], blocks)
        except UsageError as e:
            errors.append((values, str(e)))
            continue
        _check_config(config)
        method = values.get('method') or _base_method(config)
        method += ''.join(
            f'_{labels[key]}={values[key]}' for key in swept)
        runs.append(dict(
            position=position, task=config.task, method=method,
            seed=int(config.seed), argv=argv, steps=int(config.run.steps),
            values=tuple((key, values[key]) for key in swept)))
    if errors:
        raise BadGrid(_first_error(errors, position + 1))
    return _place(sweepdir, runs)


def _sweep_folder(logdir):
    text = os.path.expanduser(str(logdir))
    if '{' in text or '}' in text:
        raise BadGrid(
            f'--logdir {logdir}: a sweep\'s folder is a fixed path (no '
            f'{{timestamp}}), so that the same command resumes it.')
    return pathlib.Path(os.path.abspath(text))


def _check_config(config):
    if config.script not in SCRIPTS:
        raise BadGrid(
            f"--script {config.script}: a sweep runs --script "
            f"{', '.join(SCRIPTS)} (runs that end at run.steps).")
    if config.replicas != 1:
        raise BadGrid(
            f'--replicas {config.replicas}: each run of a sweep is one '
            f'replica (a multi-host run is its own job: docs/hosts.md).')
    if 'jsonl' not in config.logger.outputs:
        raise BadGrid(
            f"--logger.outputs {' '.join(config.logger.outputs)}: a sweep's "
            f"runs write scores.jsonl, so the outputs must hold jsonl.")


def _labels(keys):
    """The name of each swept key in a method: its last part
    (`run.train_ratio` -> `train_ratio`) unless two keys share it."""
    last = [key.rsplit('.', 1)[-1] for key in keys]
    return {key: part if last.count(part) == 1 else key
            for key, part in zip(keys, last)}


def _base_method(config):
    """A run's `method` key where the config sets one (its default is
    the original's placeholder 'name'), else the agent's name."""
    if config.method not in ('', 'name'):
        return config.method
    return config.agent_impl.rpartition(':')[2]


def _first_error(errors, count):
    values, message = errors[0]
    if len(errors) == count and all(m == message for _, m in errors):
        return message  # A flag every run shares.
    where = ', '.join(f'--{key} {value}' for key, value in values.items())
    return f'The run with {where}: {message}'


def _place(sweepdir, runs):
    """The runs with their folders: the existing folder of the same task,
    method and seed, else the index of their place in the grid or, when an
    existing folder has it, the next free index."""
    seen = {}
    for run in runs:
        key = (run['task'], run['method'], run['seed'])
        if key in seen:
            raise BadGrid(
                f"Two runs of the grid have the same folder: task "
                f"{key[0]}, method {key[1]}, seed {key[2]} (the grid lists "
                f"a value twice).")
        seen[key] = run
    existing = _existing(sweepdir)
    taken = {index for index, _ in existing.values()}
    result = []
    for run in runs:
        key = (run['task'], run['method'], run['seed'])
        if key in existing:
            index, folder = existing[key]
        else:
            index = run['position']
            if index in taken:
                index = max(taken) + 1
            taken.add(index)
            try:
                folder = names.folder(index, *key)
            except ValueError as e:
                raise BadGrid(f'--seed {key[2]}: {e}') from None
        logdir = sweepdir / folder
        result.append(Run(
            index=index, task=key[0], method=key[1], seed=key[2],
            logdir=logdir, argv=(*run['argv'], '--method', key[1],
                                 '--logdir', str(logdir)),
            steps=run['steps'], values=run['values']))
    return sorted(result, key=lambda run: run.index)


def _existing(sweepdir):
    """{(task, method, seed): (index, folder name)} of the run folders
    already in the sweep's folder."""
    found = {}
    if not sweepdir.is_dir():
        return found
    for path in sorted(sweepdir.iterdir()):
        name = names.parse(path.name)
        if name is None or not path.is_dir():
            continue
        key = name[1:]
        if key in found:
            raise BadGrid(
                f'Two folders of the sweep in {sweepdir} hold task {key[0]}, '
                f'method {key[1]}, seed {key[2]}: {found[key][1]} and '
                f'{path.name}; move one away.')
        found[key] = (name.index, path.name)
    return found
