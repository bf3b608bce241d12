"""Runs a script with `args` built as the original's dreamerv3/main.py builds
them: its `run` block and nine globals, none of the keys this package adds.

    python tests/support/original_main.py --script parallel --configs debug ...

Everything else (flags, factories, dispatch) is `embodied.main`'s.
"""

import pathlib
import sys

import elements

# The keys of the original's `run` block (dreamerv3/configs.yaml) and the
# globals its main.py adds to `args`.
ORIGINAL_RUN_KEYS = (
    'steps', 'duration', 'train_ratio', 'log_every', 'report_every',
    'save_every', 'envs', 'eval_envs', 'eval_eps', 'report_batches',
    'from_checkpoint', 'episode_timeout', 'actor_addr', 'replay_addr',
    'logger_addr', 'actor_batch', 'actor_threads', 'agent_process',
    'remote_replay', 'remote_envs', 'usage', 'debug')
ORIGINAL_GLOBALS = (
    'replica', 'replicas', 'logdir', 'batch_size', 'batch_length',
    'report_length', 'consec_train', 'consec_report', 'replay_context')


def original_args(config):
    """`args` with exactly the original's keys, values from `config`."""
    run = {key: config.run[key] for key in ORIGINAL_RUN_KEYS}
    return elements.Config(
        **run, **{key: config[key] for key in ORIGINAL_GLOBALS})


def main(argv=None):
    from embodied import main as mainlib
    config = mainlib.parse(argv)
    # The dispatch of `embodied.main.run`, with the original's `args`.
    mainlib.make_args = original_args
    mainlib.run(config)


if __name__ == '__main__':
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
    main()
