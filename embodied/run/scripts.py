"""The scripts `--script` selects, as one table.

Each row says what the script runs and what it needs; the command line's
dispatch (`embodied.main.run`), its checks (`--script` names, replicas, the
replay's size, the logger's outputs), `--help` and docs/configs.md's table
of scripts all read it. The scripts that start one role of the parallel
runner as a command of its own come from the roles table
(`embodied.run.parallel.roles`, each role's `scripts`).

A script's `run` takes the factories bound to the config (`Factories`) and
the runner's args.
"""

import collections
import dataclasses

from embodied.run.parallel import roles

# The factories of one launch, each bound to the config (embodied.main).
Factories = collections.namedtuple(
    'Factories', 'agent replay replay_eval env stream logger')


@dataclasses.dataclass(frozen=True)
class Script:
    """One `--script`.

    name: its `--script` value.
    run: (factories, args, config) -> None.
    about: what it runs, in one line (for `--help` and the docs).
    replay: whether it holds a replay (its size is checked at the start).
    logs: whether it writes the run's metrics and saves its config.
    replicas: whether several replicas may run it (`--replicas`).
    """

    name: str
    run: object
    about: str
    replay: bool = False
    logs: bool = False
    replicas: bool = False


def _train(f, args, config):
    import embodied
    embodied.run.train(f.agent, f.replay, f.env, f.stream, f.logger, args)


def _train_eval(f, args, config):
    import embodied
    embodied.run.train_eval(
        f.agent, f.replay, f.replay_eval, f.env, f.env, f.stream, f.logger,
        args)


def _eval_only(f, args, config):
    import embodied
    embodied.run.eval_only(f.agent, f.env, f.logger, args)


def _parallel(f, args, config):
    from embodied.run import parallel
    parallel.combined(
        f.agent, f.replay, f.replay_eval, f.env, f.env, f.stream, f.logger,
        args)


def _parallel_env(f, args, config):
    from embodied.run import parallel
    parallel.parallel_env(
        f.env, config.replica, args, config.replica >= args.envs)


def _parallel_envs(f, args, config):
    from embodied.run import parallel
    parallel.parallel_envs(f.env, f.env, args)


def _parallel_replay(f, args, config):
    from embodied.run import parallel
    parallel.parallel_replay(f.replay, f.replay_eval, f.stream, args)


_ROLE_SCRIPTS = {
    'parallel_env': (_parallel_env, 'one env worker (`--replica` is its '
                     'index), for a `parallel` launch on another machine'),
    'parallel_envs': (_parallel_envs, 'every env worker, for a `parallel` '
                      'launch on another machine'),
    'parallel_replay': (_parallel_replay, 'the replay only, for a '
                        '`parallel` launch on another machine'),
}

TABLE = (
    Script('train', _train, 'one process: envs, agent, replay and logger '
           'in a loop', replay=True, logs=True, replicas=True),
    Script('train_eval', _train_eval, '`train` plus eval envs and an eval '
           'replay', replay=True, logs=True),
    Script('eval_only', _eval_only, 'a saved agent (`--run.from_checkpoint`) '
           'in eval mode, optionally saving videos', logs=True),
    Script('parallel', _parallel, 'every role of the parallel runner from '
           'one command', replay=True, logs=True, replicas=True),
    *sorted((Script(name, *_ROLE_SCRIPTS[name],
                    replay=(role.name == 'replay'))
             for role in roles.TABLE for name in role.scripts),
            key=lambda script: script.name),
)

SCRIPTS = {script.name: script for script in TABLE}
NAMES = tuple(SCRIPTS)


def markdown():
    """The scripts as a markdown table (docs/configs.md)."""
    lines = ['| `--script` | what it runs |', '|---|---|']
    lines += [f'| `{s.name}` | {s.about} |' for s in TABLE]
    return '\n'.join(lines)
