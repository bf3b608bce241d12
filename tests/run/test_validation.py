"""Config values that parse but cannot work are usage errors (exit 2) that
name the key, the value and what is allowed, before any worker starts."""

import elements
import pytest

import launch
from embodied import config as configlib
from embodied import main
from embodied.run import arguments
from embodied.run import validation

BAD = [
    (('--run.envs', '0'), 'run.envs'),
    (('--batch_size', '0'), 'batch_size'),
    (('--batch_length', '0'), 'batch_length'),
    (('--replay.size', '10'), 'replay.size'),
    (('--run.actor_addr', 'notanaddr'), 'run.actor_addr'),
    (('--run.replay_addr', 'tcp://localhost:{auto}'), 'run.replay_addr'),
    (('--run.steps', '-5'), 'run.steps'),
    (('--run.save_every', '0'), 'run.save_every'),
    (('--run.log_every', '0'), 'run.log_every'),
    (('--run.envs_per_worker', '0'), 'run.envs_per_worker'),
    (('--run.train_ratio', '0'), 'run.train_ratio'),
    (('--run.actor_batch', '9'), 'run.actor_batch'),
    (('--run.save_keep', '0'), 'run.save_keep'),
    (('--run.logger_addr', 'localhost:99999'), 'run.logger_addr'),
    (('--run.policy_worker', 'yes'), 'run.policy_worker'),
    (('--run.policy_sync_every', '0'), 'run.policy_sync_every'),
    (('--run.policy_memory', '1.5'), 'run.policy_memory'),
]


@pytest.mark.parametrize('flags,key', BAD)
def test_bad_value_is_a_usage_error_naming_key_and_value(flags, key):
    with pytest.raises(main.UsageError) as e:
        main.parse(['--configs', 'debug', '--task', 'dummy_disc',
                    '--script', 'parallel', *flags])
    message = str(e.value)
    assert f'{key} = ' in message, message
    assert 'expected' in message, message


@pytest.mark.parametrize('script', ['parallel', 'train'])
def test_negative_train_ratio_is_the_originals_no_limit(script):
    config = main.parse(['--configs', 'debug', '--task', 'dummy_disc',
                         '--script', script, '--run.train_ratio', '-1'])
    assert config.run.train_ratio == -1
    for value in ('0', 'inf', 'nan'):
        with pytest.raises(main.UsageError, match='or < 0 for no limit'):
            main.parse(['--configs', 'debug', '--task', 'dummy_disc',
                        '--script', script, '--run.train_ratio', value])


def test_every_shipped_block_is_valid():
    blocks = configlib.load_blocks()
    for name in blocks:
        config = configlib.build(['defaults', name] if name != 'defaults'
                                 else ['defaults'], blocks)
        validation.check_config(config)


def test_check_args_reports_every_bad_key_of_runner_args():
    args = arguments.with_defaults(elements.Config(
        logdir='/tmp/x', envs=0, save_every=0, batch_size=0))
    with pytest.raises(validation.BadValue) as e:
        validation.check_args(args)
    keys = [p.split(' = ')[0] for p in e.value.problems]
    assert keys == ['run.save_every', 'run.envs', 'batch_size'], keys


def test_bad_value_exits_2_before_any_worker(tmp_path):
    result = launch.run(
        '--script', 'parallel', '--configs', 'debug', '--task', 'dummy_disc',
        '--agent_impl', 'testing', '--run.envs', '0',
        '--logdir', tmp_path / 'run')
    assert result.returncode == 2, result.stdout[-2000:]
    assert 'run.envs = 0' in result.stdout
    assert 'Traceback' not in result.stdout
    assert not (tmp_path / 'run').exists()
