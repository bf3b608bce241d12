"""embodied.sweep: the grid a command line expands to, the folder names the
original's plot.py reads, bad grids refused before anything starts, and
docs/sweeps.md's local sweep of 2 tasks x 2 seeds (with the numpy test
agent): stopped by Ctrl-C with its saves, resumed, then skipped; a sweep
killed outright stops its runs with their saves."""

import os
import re
import shlex
import signal
import subprocess
import sys
import time

import psutil
import pytest

import launch
from embodied.sweep import grid
from embodied.sweep import names
from embodied.sweep import slurm
from embodied.sweep import state

PAGE = launch.ROOT / 'docs' / 'sweeps.md'


def plan(tmp_path, *argv):
    return grid.expand(grid.split(['--logdir', str(tmp_path / 'sweep'),
                                   *map(str, argv)]))


def flag(run, key):
    """The value the run's command line gives `--key` (the last one)."""
    argv = list(run.argv)
    index = len(argv) - 1 - argv[::-1].index(f'--{key}')
    return argv[index + 1]


# Folder names


@pytest.mark.parametrize('task, method', [
    ('dummy_disc', 'dreamerv3'),
    ('gym_CartPole-v1', 'dreamerv3'),
    ('gym_my_envs:Corridor-v0', 'dreamerv3_policy_mesh=-1,1,1'),
    ('a%2Db-c', 'x y/z~{w}'),
])
def test_folder_names_split_in_four_and_read_back(task, method):
    name = names.folder(7, task, method, 3)
    # The original's plot.py: `_, task, method, seed = name.split('-')`.
    assert len(name.split('-')) == 4, name
    assert names.parse(name) == (7, task, method, 3)
    assert names.task_method_seed(name) == (task, method, 3)
    assert re.fullmatch(r'[A-Za-z0-9_.,=+:@%-]+', name), name


def test_folder_names_of_the_layout_only():
    assert names.folder(0, 'gym_CartPole-v1', 'dreamerv3', 1) == (
        '0-gym_CartPole%2Dv1-dreamerv3-1')
    for other in ('slurm', 'a-b-c', '0-a-b-c-d', 'x-task-method-0',
                  '0-task-method-seed', '0-ta sk-m-0', '0-%ff-m-0'):
        assert names.parse(other) is None, other
    with pytest.raises(ValueError, match='at least 0'):
        names.folder(0, 'dummy_disc', 'dreamerv3', -1)


# The grid


def test_grid_expands_tasks_outermost_seeds_innermost(tmp_path):
    runs = plan(tmp_path, '--configs', 'debug', '--seed', 0, 1, '--task',
                'dummy_disc', 'cartpole_balance', '--run.train_ratio', 32, 64,
                '--jax.train_devices', 0, '--run.steps', 500)
    assert [run.name for run in runs] == [
        '0-dummy_disc-dreamerv3_train_ratio=32-0',
        '1-dummy_disc-dreamerv3_train_ratio=32-1',
        '2-dummy_disc-dreamerv3_train_ratio=64-0',
        '3-dummy_disc-dreamerv3_train_ratio=64-1',
        '4-cartpole_balance-dreamerv3_train_ratio=32-0',
        '5-cartpole_balance-dreamerv3_train_ratio=32-1',
        '6-cartpole_balance-dreamerv3_train_ratio=64-0',
        '7-cartpole_balance-dreamerv3_train_ratio=64-1']
    run = runs[5]
    assert (run.task, run.seed, run.steps) == ('cartpole_balance', 1, 500)
    assert run.values == (('run.train_ratio', '32'),)
    assert run.logdir == tmp_path / 'sweep' / run.name
    assert flag(run, 'logdir') == str(run.logdir)
    assert flag(run, 'method') == 'dreamerv3_train_ratio=32'
    assert flag(run, 'jax.train_devices') == '0'
    assert not (tmp_path / 'sweep').exists()  # Planning writes nothing.


def test_values_keep_their_commas_and_list_keys_read_theirs(tmp_path):
    from embodied import config as configlib
    from embodied import main
    blocks = configlib.load_blocks()
    runs = plan(tmp_path, '--configs', 'debug', '--jax.policy_mesh', '-1,1,1',
                '1,-1,1', '--grid.configs', 'debug,dummy', 'debug')
    assert len(runs) == 4
    configs = [main.parse(run.argv, blocks) for run in runs]
    assert [c.jax.policy_mesh for c in configs] == [
        '-1,1,1', '-1,1,1', '1,-1,1', '1,-1,1']
    assert [c.task for c in configs] == [
        'dummy_disc', 'cartpole_balance', 'dummy_disc', 'cartpole_balance']
    assert runs[0].name == (
        '0-dummy_disc-dreamerv3_policy_mesh=%2D1,1,1_configs=debug,dummy-0')
    # A list key given several values is one list, as in embodied.main.
    runs = plan(tmp_path, '--configs', 'debug', '--jax.train_devices', 0, 1)
    assert len(runs) == 1
    assert main.parse(runs[0].argv, blocks).jax.train_devices == (0, 1)


def test_methods_and_agents_name_the_runs(tmp_path):
    runs = plan(tmp_path, '--configs', 'debug', '--agent_impl', 'testing',
                '--task', 'gym_CartPole-v1')
    assert [run.name for run in runs] == ['0-gym_CartPole%2Dv1-testing-0']
    runs = plan(tmp_path, '--configs', 'debug', '--method', 'ours', 'base')
    assert [run.name for run in runs] == [
        '0-cartpole_balance-ours-0', '1-cartpole_balance-base-0']


def test_existing_folders_keep_their_runs_and_new_runs_take_free_indices(
        tmp_path):
    first = plan(tmp_path, '--configs', 'debug', '--task', 'dummy_disc',
                 'cartpole_balance', '--seed', 0, 1)
    for run in first:
        run.logdir.mkdir(parents=True)
    (tmp_path / 'sweep' / 'slurm').mkdir()  # Not a run: left alone.
    again = plan(tmp_path, '--configs', 'debug', '--task', 'dummy_disc',
                 'cartpole_balance', '--seed', 0, 1, 2)
    assert [run.name for run in again] == [
        '0-dummy_disc-dreamerv3-0', '1-dummy_disc-dreamerv3-1',
        '2-cartpole_balance-dreamerv3-0', '3-cartpole_balance-dreamerv3-1',
        '4-dummy_disc-dreamerv3-2', '5-cartpole_balance-dreamerv3-2']


BAD = [
    (('--run.stepz', 5), "Unknown flag '--run.stepz'. The closest known key "
                         "is 'run.steps'."),
    (('--seed',), '--seed has no value: give it one or more.'),
    (('--grid.run.train_ratio',), '--grid.run.train_ratio has no value'),
    (('--seed', 0, 1, 0), 'Two runs of the grid have the same folder: task '
                          'dummy_disc, method dreamerv3, seed 0'),
    (('--run.train_ratio', 32, 'x'), "The run with --run.train_ratio x: "
                                     "Cannot convert 'x' to type 'float'"),
    (('--sweep.paralel', 2), 'Unknown sweep option --sweep.paralel'),
    (('--script', 'eval_only'), 'a sweep runs --script train, train_eval, '
                                'parallel'),
    (('--logger.outputs', 'tensorboard'), 'the outputs must hold jsonl'),
    (('--seed', -1), '--seed -1: A run folder needs an index and seed of at '
                     'least 0'),
]


@pytest.mark.parametrize('argv, message', BAD)
def test_bad_grids_are_refused_before_anything_starts(tmp_path, argv, message):
    with pytest.raises(grid.BadGrid) as error:
        plan(tmp_path, '--configs', 'debug', '--task', 'dummy_disc', *argv)
    assert message in str(error.value)
    assert '\n' not in str(error.value)
    assert not (tmp_path / 'sweep').exists()


def test_existing_folders_of_one_run_twice_are_refused(tmp_path):
    for name in ('0-dummy_disc-dreamerv3-0', '5-dummy_disc-dreamerv3-0'):
        (tmp_path / 'sweep' / name).mkdir(parents=True)
    with pytest.raises(grid.BadGrid, match='Two folders of the sweep'):
        plan(tmp_path, '--configs', 'debug', '--task', 'dummy_disc')


def test_the_command_says_one_line_and_exits_2(tmp_path):
    """As a user runs it: the line on stderr, exit code 2, nothing written
    (the unknown key in the second task's runs only)."""
    result = launch.run(
        '--logdir', tmp_path / 'sweep', '--configs', 'debug', '--task',
        'dummy_disc', 'cartpole_balance', '--grid.env.dummy.lenght', 5,
        module='embodied.sweep', timeout=120)
    assert result.returncode == 2, result.stdout
    assert result.stdout.strip().splitlines() == [
        "error: Unknown flag '--env.dummy.lenght'. The closest known key is "
        "'env.dummy.length'."], result.stdout
    assert not (tmp_path / 'sweep').exists()
    result = launch.run('--configs', 'debug', module='embodied.sweep',
                        timeout=120)
    assert result.returncode == 2
    assert result.stdout.startswith('error: A sweep needs --logdir'), (
        result.stdout)


def test_dry_run_lists_the_runs_and_starts_nothing(tmp_path):
    result = launch.run(
        '--logdir', tmp_path / 'sweep', '--configs', 'debug', '--task',
        'dummy_disc', 'cartpole_balance', '--sweep.dry', 'True',
        module='embodied.sweep', timeout=120)
    assert result.returncode == 0, result.stdout
    assert '  0-dummy_disc-dreamerv3-0: new' in result.stdout
    assert '  1-cartpole_balance-dreamerv3-0: new' in result.stdout
    assert not (tmp_path / 'sweep').exists()


def test_planning_imports_no_jax():
    launch.assert_imports_without(['embodied.sweep', 'embodied.sweep.cli'],
                                  ['jax'])
    code = ('import sys; from embodied import sweep; '
            "sweep.plan('/nonexistent/sweep', ['--configs', 'debug'], "
            "seeds=[0, 1]); assert 'jax' not in sys.modules")
    result = subprocess.run([sys.executable, '-c', code], env=launch.env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_a_second_sweep_in_the_same_folder_is_refused(tmp_path):
    import fcntl
    (tmp_path / 'sweep').mkdir()
    with open(tmp_path / 'sweep' / '.sweep.lock', 'a+') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        lock.write('pid 12345')
        lock.flush()
        result = launch.run('--logdir', tmp_path / 'sweep', '--configs',
                            'debug', module='embodied.sweep', timeout=120)
    assert result.returncode == 2, result.stdout
    assert (f'error: another sweep runs in {tmp_path / "sweep"} (pid 12345)'
            in result.stdout), result.stdout
    assert [p.name for p in (tmp_path / 'sweep').iterdir()] == ['.sweep.lock']


# The Slurm array's script


def test_array_script_picks_each_run_by_its_index(tmp_path):
    runs = plan(tmp_path, '--configs', 'debug', '--task', 'dummy_disc',
                'gym_CartPole-v1', '--jax.policy_mesh', '-1,1,1')
    text = slurm.script(runs, tmp_path / 'sweep', gpus=2, python='/x/python')
    assert '#SBATCH --gpus=2\n' in text
    assert '#SBATCH --gpus' not in slurm.script(runs, tmp_path / 'sweep', 0)
    for run in runs:
        assert (f'  {run.index}) LOGDIR={shlex.quote(str(run.logdir))}\n'
                f'     set -- {shlex.join(run.argv)} ;;') in text
    assert "'-1,1,1'" not in text and ' -1,1,1 ' in text
    assert "/x/python -m embodied.main \"$@\" &" in text
    assert f'--job-name={slurm.job_name(tmp_path / "sweep")}' in text
    script = tmp_path / 'array.sbatch'
    script.write_text(text)
    result = subprocess.run(['bash', '-n', str(script)], capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr


def test_array_spec():
    assert slurm.array_spec([5, 0, 1, 2, 7, 8]) == '0-2,5,7-8'
    assert slurm.array_spec([3], parallel=2) == '3%2'


# Runs


def page_command():
    """docs/sweeps.md's local sweep, as argv after `python -m
    embodied.sweep`."""
    commands = re.findall(r'^(python -m embodied\.sweep .*)$',
                          PAGE.read_text(), re.M)
    local = [c for c in commands if 'slurm' not in c]
    assert len(local) == 1, commands
    argv = shlex.split(local[0])[3:]
    assert argv[:2] == ['--logdir', '~/logdir/sweep'], argv
    return argv[2:]


def sweep_command(tmp_path, *extra):
    """The page's sweep in `tmp_path`, with the numpy test agent (the
    runs' DreamerV3 is tested elsewhere: this tests the sweep)."""
    return ('--logdir', tmp_path / 'sweep', *page_command(),
            '--agent_impl', 'testing', *extra)


def folders(tmp_path):
    return {path.name: path for path in (tmp_path / 'sweep').iterdir()
            if names.parse(path.name)}


def wait_until(predicate, what, proc, timeout=300):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.proc.poll() is None, (what, proc.output()[-3000:])
        assert time.monotonic() < deadline, (what, proc.output()[-3000:])
        time.sleep(0.1)


def in_loop(folder):
    """The run's loop began: it logged its first metrics."""
    return (folder / 'metrics.jsonl').exists()


@pytest.mark.slow
def test_page_sweep_stops_on_ctrl_c_then_resumes_then_skips(tmp_path):
    """docs/sweeps.md's 2 tasks x 2 seeds, 2 at a time: a Ctrl-C while the
    first two run stops both with their saves and starts no more; the same
    command resumes those two and runs the other two to their steps; once
    more, it skips all four. The first launch burns CPU in each train step
    so that its runs are still running at the Ctrl-C."""
    steps = int(float(page_command()[page_command().index('--run.steps') + 1]))
    first = launch.Launch(
        *sweep_command(tmp_path, '--testing.train_burn', 0.1),
        module='embodied.sweep', logfile=tmp_path / 'first.log')
    try:
        wait_until(lambda: (tmp_path / 'sweep').exists() and len(
            folders(tmp_path)) == 2 and all(
            in_loop(f) for f in folders(tmp_path).values()),
            'the first two runs to step', first)
        first.terminate(signal.SIGINT)
        assert first.wait(180) == 130, first.output()
    finally:
        first.kill()
    output = first.output()
    assert 'Received SIGINT: stopping 2 runs with their final saves' in output
    stopped = folders(tmp_path)
    assert sorted(stopped) == [
        '0-dummy_disc-testing-0', '1-dummy_disc-testing-1'], output
    saved = {}
    for name, folder in stopped.items():
        saved[name] = state.saved_step(folder)
        assert saved[name] is not None and saved[name] < steps, output
        assert f'Stopped {name} (saved at step {saved[name]} of {steps})' in (
            output)
        assert 'Received SIGTERM' in (folder / 'output.log').read_text()
    assert 'Sweep stopped by SIGINT; 4 runs unfinished.' in output

    result = launch.run(*sweep_command(tmp_path), module='embodied.sweep',
                        timeout=600)
    output = result.stdout
    assert result.returncode == 0, output
    for name, step in saved.items():
        assert f'Resuming {name} (saved at step {step} of {steps})' in output
        log = (tmp_path / 'sweep' / name / 'output.log').read_text()
        assert f'Resumed from the save at step {step}.' in log
    for name in ('2-cartpole_balance-testing-0',
                 '3-cartpole_balance-testing-1'):
        assert f'Starting {name} (new).' in output
    runs = folders(tmp_path)
    assert len(runs) == 4
    for name, folder in runs.items():
        assert state.saved_step(folder) >= steps, name
        assert f'Finished {name} (finished at step' in output
        assert (folder / 'scores.jsonl').stat().st_size > 0, name
    assert output.rstrip().endswith('Every run of the sweep is finished.')

    logs = {name: (folder / 'output.log').stat().st_size
            for name, folder in runs.items()}
    result = launch.run(*sweep_command(tmp_path), module='embodied.sweep',
                        timeout=120)
    assert result.returncode == 0, result.stdout
    for name in runs:
        assert f'Skipping {name}: finished at step' in result.stdout
    assert 'Starting' not in result.stdout
    assert logs == {name: (folder / 'output.log').stat().st_size
                    for name, folder in runs.items()}


@pytest.mark.slow
def test_a_killed_sweep_leaves_no_run_behind(tmp_path):
    """SIGKILL to the sweep: its run gets SIGTERM from the kernel (the
    death signal the sweep asked for), saves and exits."""
    sweep = launch.Launch(
        '--logdir', tmp_path / 'sweep', '--configs', 'debug', '--agent_impl',
        'testing', '--task', 'dummy_disc', '--run.steps', 1e6,
        '--testing.train_burn', 0.1, module='embodied.sweep',
        logfile=tmp_path / 'sweep.log')
    folder = tmp_path / 'sweep' / '0-dummy_disc-testing-0'
    run = None
    try:
        wait_until(lambda: in_loop(folder), 'the run to step', sweep)
        (run,) = psutil.Process(sweep.proc.pid).children()
        sweep.proc.kill()
        sweep.wait(30)
        run.wait(120)
    finally:
        sweep.kill()
        if run is not None and run.is_running():
            os.killpg(run.pid, signal.SIGKILL)
    text = (folder / 'output.log').read_text()
    assert 'Received SIGTERM' in text, text[-3000:]
    assert state.saved_step(folder) > 0, text[-3000:]
    # Its env workers (the run's process group) went with it.
    deadline = time.monotonic() + 60
    while group(run.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = group(run.pid)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, left


def group(pgid):
    """The pids of the live processes of process group `pgid`."""
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and (
                    proc.status() != psutil.STATUS_ZOMBIE):
                found.append(proc.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    return found
