"""Trains DreamerV3 on the corridor with the parallel runner, from a script
of your own with your own env factory (docs/own-environment.md):

    python examples/own_env/corridor_script.py --configs debug \
        --run.steps 200 --logdir logdir/corridor-script
"""

import sys
from functools import partial as bind

import embodied
from embodied import main as m

from corridor import Corridor


def make_env(config, index):
    return m.wrap_env(Corridor(length=8), config)


if __name__ == '__main__':  # Workers are spawned and import this script.
    config = m.parse(sys.argv[1:])  # the flags of python -m embodied.main
    embodied.run.parallel.combined(
        bind(m.make_agent, config, make_env=make_env),
        bind(m.make_replay, config, 'replay'),
        bind(m.make_replay, config, 'replay_eval', 'eval'),
        bind(make_env, config), bind(make_env, config),
        bind(m.make_stream, config), bind(m.make_logger, config),
        m.make_args(config))
