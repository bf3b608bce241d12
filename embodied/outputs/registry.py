"""The logger outputs `logger.outputs` may name, as one table.

`make_logger` (embodied/factories.py) builds each named output from its row,
the config checks (embodied/run/validation.py) refuse a name that has none
and an output whose package is missing, and docs/configs.md lists them. A
new output adds its module and a row here.
"""

import dataclasses

import elements


@dataclasses.dataclass(frozen=True)
class Output:
    """One logger output.

    name: its name in `logger.outputs`.
    build: config -> list of `elements.logger` outputs.
    about: what it writes, in one line.
    package: the Python package it needs beyond the runtime's ('' none),
        with the extra that installs it.
    """

    name: str
    build: object
    about: str
    package: tuple = ()


def _jsonl(config):
    from embodied.outputs.jsonl import JSONLOutput
    return [JSONLOutput(config.logdir, 'metrics.jsonl'),
            JSONLOutput(config.logdir, 'scores.jsonl', 'episode/score')]


def _tensorboard(config):
    from embodied.outputs.tensorboard import TensorBoardOutput
    return [TensorBoardOutput(config.logdir, config.logger.fps)]


def _wandb(config):
    """The W&B output, with the run's config; an unnamed run gets the
    original's name, the last four parts of the logdir."""
    from embodied.outputs import wandb
    keys = dict(config.logger.wandb)
    keys['name'] = keys['name'] or '/'.join(config.logdir.split('/')[-4:])
    return [wandb.WandBOutput(
        config.logdir, wandb.run_config(config), fps=config.logger.fps,
        **keys)]


def _scope(config):
    return [elements.logger.ScopeOutput(elements.Path(config.logdir))]


TABLE = (
    Output('jsonl', _jsonl, '`metrics.jsonl` (every metric, with wall '
           'time) and `scores.jsonl` (episode scores) in the logdir'),
    Output('tensorboard', _tensorboard, 'TensorBoard event files in the '
           'logdir, videos included (tensorboardX)',
           ('tensorboardX', 'tensorboard')),
    Output('wandb', _wandb, 'a Weights & Biases run, continued by a '
           'relaunch (`logger.wandb.*`)', ('wandb', 'wandb')),
    Output('scope', _scope, "elements' scope files in the logdir"),
)

OUTPUTS = {output.name: output for output in TABLE}
NAMES = tuple(OUTPUTS)


def markdown():
    """The outputs as a markdown table (docs/configs.md)."""
    lines = ['| `logger.outputs` | what it writes |', '|---|---|']
    lines += [f'| `{o.name}` | {o.about} |' for o in TABLE]
    return '\n'.join(lines)
