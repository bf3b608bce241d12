"""The command line: config blocks, flags, errors, and where configs live."""

import subprocess
import sys
import textwrap
import zipfile

import pytest

from embodied import config as configlib
from embodied import main

import launch


def test_defaults_have_the_original_keys():
    config = configlib.build([])
    for key in (
            'logdir', 'replica', 'replicas', 'task', 'seed', 'script',
            'batch_size', 'batch_length', 'report_length', 'consec_train',
            'consec_report', 'replay_context', 'random_agent', 'logger',
            'env', 'replay', 'jax'):
        assert key in config, key
    for key in (
            'steps', 'duration', 'train_ratio', 'log_every', 'report_every',
            'save_every', 'envs', 'eval_envs', 'eval_eps', 'report_batches',
            'from_checkpoint', 'from_checkpoint_regex', 'episode_timeout',
            'actor_addr', 'replay_addr', 'logger_addr', 'actor_batch',
            'actor_threads', 'agent_process', 'remote_replay', 'remote_envs',
            'usage', 'debug'):
        assert key in config.run, key
    assert config.run.from_checkpoint_regex == ''


def test_blocks_apply_in_order(tmp_path):
    config = main.parse([
        '--configs', 'debug', 'dummy', '--run.steps', '123',
        '--logdir', str(tmp_path / '{timestamp}')])
    assert config.task == 'dummy_disc'
    assert config.run.steps == 123
    assert config.batch_size == 8
    assert '{timestamp}' not in config.logdir


def test_a_renamed_key_still_takes_its_old_name(tmp_path):
    """`run.policy_process` is now `run.policy_worker`: the old flag, in
    either spelling, and a saved config.yaml of an older run still work."""
    for flags in (['--run.policy_process', 'process'],
                  ['--run.policy_process=process']):
        config = main.parse(['--logdir', str(tmp_path), *flags])
        assert config.run.policy_worker == 'process'
        assert 'run.policy_process' not in config.flat
    from embodied import policy
    saved = dict(configlib.build([]).flat)
    del saved['run.policy_worker']
    saved['run.policy_process'] = 'thread'
    import elements
    elements.Config(saved).save(str(tmp_path / 'config.yaml'))
    config = policy.run_config(tmp_path)
    assert config.run.policy_worker == 'thread'
    assert 'run.policy_process' not in config.flat


def test_unknown_flag_names_closest_key():
    with pytest.raises(main.UsageError) as e:
        main.parse(['--run.step', '10'])
    assert "'--run.step'" in str(e.value)
    assert "'run.steps'" in str(e.value)


def test_bad_value_names_key():
    with pytest.raises(main.UsageError) as e:
        main.parse(['--run.steps', 'many'])
    assert 'run.steps' in str(e.value)
    with pytest.raises(main.UsageError) as e:
        main.parse(['--random_agent', 'yes'])
    assert 'random_agent' in str(e.value)


def test_unknown_block_script_and_task():
    with pytest.raises(main.UsageError, match="'debgu'.*'debug'"):
        main.parse(['--configs', 'debgu'])
    with pytest.raises(main.UsageError, match="--script 'trian'"):
        main.parse(['--script', 'trian'])
    with pytest.raises(main.UsageError, match="--task 'nosuch_task'"):
        main.parse(['--task', 'nosuch_task'])


def test_command_line_error_exits_nonzero(tmp_path):
    result = launch.run('--run.stesp', '10', '--logdir', tmp_path)
    assert result.returncode == 2, result.stdout
    assert "Unknown flag '--run.stesp'" in result.stdout
    assert 'run.steps' in result.stdout
    assert 'Traceback' not in result.stdout


def test_duplicate_key_across_files_is_an_error(tmp_path):
    (tmp_path / 'a.yaml').write_text('defaults:\n  x: 1\n')
    (tmp_path / 'b.yaml').write_text('defaults:\n  x: 2\n')
    with pytest.raises(ValueError, match="'x'"):
        configlib.load_blocks(tmp_path)


def test_configs_ship_inside_the_wheel(tmp_path):
    """A non-editable install finds the YAML under embodied/configs and runs
    the measurement tools without the checkout's devtools/."""
    subprocess.run(
        [sys.executable, '-m', 'pip', 'wheel', '--no-deps', '--no-build-isolation',
         '-q', '-w', str(tmp_path), str(launch.ROOT)],
        check=True, capture_output=True)
    wheel, = tmp_path.glob('embodied-*.whl')
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        zf.extractall(tmp_path / 'site')
    assert 'embodied/configs/defaults.yaml' in names
    # DreamerV3's published scores and their credit (embodied/plot/data).
    for suite in ('atari100k', 'atari57', 'dmc_proprio', 'dmc_vision',
                  'dmlab30', 'minecraft_diamond', 'procgen'):
        assert f'embodied/plot/data/{suite}-dreamerv3.json.gz' in names
    assert 'embodied/plot/data/README.md' in names
    assert 'embodied/plot/data/normalization.yaml' in names
    code = (
        'import embodied.config as c, pathlib; '
        'd = c.config_dir(); '
        f'assert d == pathlib.Path({str(tmp_path / "site")!r}) / "embodied" / "configs", d; '
        'assert "debug" in c.load_blocks(); '
        'from embodied.plot import published; '
        'assert len(published.load("dmc_proprio")) == 90; '
        'assert published.normalization()["dmlab30"]')
    env = launch.env()
    env['PYTHONPATH'] = str(tmp_path / 'site')
    subprocess.run(
        [sys.executable, '-c', code], check=True, env=env, cwd=tmp_path)
    # The measurement tools ship; the development tools (devtools/) do not,
    # and what needs them says so.
    assert 'embodied/perf/gpu_check.py' in names
    assert not [n for n in names if n.startswith('devtools/')]
    tools = ('agent_speed gpu_check launch_time learning param_transfer '
             'throughput').split()
    imports = '; '.join(f'import embodied.perf.{x}' for x in tools)
    subprocess.run(
        [sys.executable, '-c', imports], check=True, env=env, cwd=tmp_path)
    # What needs devtools/ says so, as a usage error, before anything runs.
    # An editable install of this checkout puts devtools/ on the path, which
    # a wheel's user never has: the import is blocked here, so the test sees
    # what that user sees however embodied is installed. And with no rows to
    # run, a tool that found devtools/ anyway would launch no benchmark.
    site = str(tmp_path / 'site')
    code = textwrap.dedent(f'''
        import importlib.abc, runpy, sys
        class NoDevtools(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split('.')[0] == 'devtools':
                    raise ModuleNotFoundError(
                        f'No module named {{name!r}}', name=name)
        sys.meta_path.insert(0, NoDevtools())
        from embodied.perf import checkout
        assert str(checkout.ROOT) == {site!r}, checkout.ROOT
        sys.argv = ['throughput', '--old', 'HEAD', '--skip_random',
                    '--skip_agent']
        runpy.run_module('embodied.perf.throughput', run_name='__main__')
    ''')
    old = subprocess.run(
        [sys.executable, '-c', code], env=env, cwd=tmp_path,
        capture_output=True, text=True, timeout=60)
    assert old.returncode == 2, old.stderr[-2000:]
    assert '--old HEAD needs a git clone of embodied' in old.stderr
    assert 'Traceback' not in old.stderr
    assert old.stdout == ''  # No table: nothing was measured.


def test_oversized_replay_is_refused_before_allocating(tmp_path):
    result = launch.run(
        '--configs', 'debug', '--task', 'dummy_disc', '--replay.size', '1e12',
        '--logdir', tmp_path / 'run', timeout=300)
    assert result.returncode == 2, result.stdout[-2000:]
    assert 'replay.size' in result.stdout
    assert 'available' in result.stdout
    assert 'Traceback' not in result.stdout
    assert not (tmp_path / 'run' / 'replay').exists()


def test_replay_estimate_counts_image_bytes():
    from embodied.run import replay_size
    config = main.parse(['--configs', 'debug', '--task', 'dummy_disc'])
    spaces = main.replay_spaces(config)
    train = replay_size.replay_bytes(config, spaces, 'train')
    assert train >= config.replay.size * 64 * 64 * 3
    with pytest.raises(replay_size.ReplayTooLarge, match=r'--replay.size'):
        replay_size.check_replay_fits(config, spaces, available=train // 2)
