"""The paths a user runs, as a user runs them: the default DreamerV3 agent on
CPU at the `debug` size with few steps. Every `--script`, every suite block
under `train` and `parallel`, and every shell command of README.md, read from
README.md itself, so a README command that stops working fails here.

Every DreamerV3 run also checks that the agent compiled ahead and never
traced again mid-run ('Agent: tracing ...' is printed when it does).
"""

import json
import os
import pathlib
import re
import shlex
import sys

import pytest

import launch
from tests.run.parallel import test_parallel

os.environ.setdefault('MUJOCO_GL', 'egl')

README = launch.ROOT / 'README.md'
STEPS = 300  # env steps of every DreamerV3 run here
QUICK = ('--run.steps', str(STEPS), '--run.log_every', '5')
TIMEOUT = 600
SUITES = {
    # block: (import, extra flags)
    'atari': ('ale_py', ()),
    'atari100k': ('ale_py', ()),
    'crafter': ('crafter', ()),
    'dmc_vision': ('dm_control.suite', ()),
    'dmc_proprio': ('dm_control.suite', ()),
}


def check_output(code, output, dreamer=True):
    assert code == 0, output[-4000:]
    assert 'Traceback' not in output, output[-4000:]
    if dreamer:
        assert 'Compiled the agent in' in output, output[-4000:]
        assert 'Agent: tracing' not in output, output[-4000:]


def run(*flags, module='embodied.main', dreamer=True):
    result = launch.run(*flags, module=module, timeout=TIMEOUT)
    check_output(result.returncode, result.stdout, dreamer)
    return result.stdout


# Scripts


def test_train_then_eval_only_from_its_checkpoint(tmp_path):
    logdir = tmp_path / 'train'
    output = run('--configs', 'debug', '--script', 'train', *QUICK,
                 '--logdir', logdir)
    assert 'Reached run.steps' in output
    assert launch.saved_tags(logdir, 'agent')
    output = run('--configs', 'debug', '--script', 'eval_only',
                 '--run.from_checkpoint', logdir, '--run.steps', '100',
                 '--logdir', tmp_path / 'eval')
    assert launch.saved_tags(tmp_path / 'eval', 'eval')[-1] >= 100


def test_train_eval(tmp_path):
    logdir = tmp_path / 'run'
    run('--configs', 'debug', '--script', 'train_eval', *QUICK,
        '--run.report_every', '1', '--logdir', logdir)
    rows = launch.metrics(logdir)
    assert any('eval_episode/score' in row for row in rows)


REMOTE = {
    # role script: (flags of the main command, flags of the role command)
    'parallel_envs': (('--run.remote_envs', 'True'), ()),
    'parallel_env': (
        ('--run.remote_envs', 'True', '--run.eval_envs', '0',
         '--run.envs', '1', '--run.actor_batch', '1'),
        ('--run.eval_envs', '0', '--run.envs', '1', '--replica', '0')),
    'parallel_replay': (('--run.remote_replay', 'True'), ()),
}


@pytest.mark.parametrize('script', sorted(REMOTE))
def test_parallel_with_a_role_as_its_own_command(tmp_path, script):
    """`--script parallel` with one role started as a separate command, as
    on another machine."""
    from embodied.rpc import addresses
    ports = addresses.free_ports(3)
    logdir = tmp_path / 'run'
    common = (
        '--configs', 'debug', *QUICK, '--logdir', logdir,
        '--run.actor_addr', f'localhost:{ports[0]}',
        '--run.replay_addr', f'localhost:{ports[1]}',
        '--run.logger_addr', f'localhost:{ports[2]}')
    main_flags, role_flags = REMOTE[script]
    runs = [
        launch.Launch('--script', 'parallel', *common, *main_flags,
                      logfile=tmp_path / 'main.log'),
        launch.Launch('--script', script, *common, *role_flags,
                      logfile=tmp_path / 'role.log'),
    ]
    outputs = test_parallel.finish_all(runs, timeout=TIMEOUT)
    check_output(0, outputs[0])
    assert f'Reached run.steps ({STEPS})' in outputs[0]


# Suites


def suite_flags(block):
    """The block at the debug size; a train ratio of 32 instead of the
    block's (up to 1024) keeps the few hundred steps quick."""
    module, flags = SUITES[block]
    pytest.importorskip(module)
    return ('--configs', block, 'debug', *flags, *QUICK,
            '--run.envs', '2', '--run.eval_envs', '0',
            '--run.train_ratio', '32')


@pytest.mark.parametrize('block', sorted(SUITES))
def test_suite_trains(tmp_path, block):
    output = run(*suite_flags(block), '--script', 'train',
                 '--logdir', tmp_path / 'run')
    assert 'Reached run.steps' in output


# The README's suite commands run the parallel runner on atari100k, crafter
# and dmc_vision at size1m; the other two blocks run here.
@pytest.mark.parametrize('block', ['atari', 'dmc_proprio'])
def test_suite_parallel(tmp_path, block):
    output = run(*suite_flags(block), '--script', 'parallel',
                 '--logdir', tmp_path / 'run')
    assert f'Reached run.steps ({STEPS})' in output


# README.md


# README commands that are not runs of this package, and why they are not
# run here.
NOT_RUN = {
    'python3 -m venv': 'creates the environment this test runs in',
    '.': 'activates that environment',
    'pip install': 'installs into that environment',
    'python -m pytest': 'the test suite itself',
    'tensorboard': 'a server that runs until stopped',
    'git clone': 'fetches the original for the tests that compare with it',
    # docs/hosts.md: replicas need several commands at once (or a cluster);
    # tests/run/test_replicas.py runs two replicas on loopback and reads
    # both recipes.
    'sbatch': 'needs a Slurm cluster',
    'kubectl': 'needs a Kubernetes cluster',
    'python -m embodied.main --configs cartpole --script train --logdir /shared/logdir/run1 --replica 0 --replicas 2 --jax.coordinator_address host0:8476':
        'one of several replicas started together',
    'python -m embodied.main --configs cartpole --script train --logdir /shared/logdir/run1 --replica 1 --replicas 2 --jax.coordinator_address host0:8476':
        'one of several replicas started together',
    'python -m embodied.main --configs debug --task dummy_disc --logdir ~/logdir/replicas --replica 0 --replicas 2 --jax.coordinator_address 127.0.0.1:8476 --jax.mock_devices 2 --jax.train_devices 0 1 &':
        'one of several replicas started together',
    'python -m embodied.main --configs debug --task dummy_disc --logdir ~/logdir/replicas --replica 1 --replicas 2 --jax.coordinator_address 127.0.0.1:8476 --jax.mock_devices 2 --jax.train_devices 0 1':
        'one of several replicas started together',
}


def without_env(command):
    """The command without its leading `NAME=value` assignments."""
    return re.sub(r'^([A-Z_][A-Z0-9_]*=\S+\s+)+', '', command)


def readme_commands():
    """The shell commands of README.md: the lines of its ```sh blocks (split
    at `&&`) and the commands in its tables, in order."""
    text = README.read_text()
    commands = []
    for block in re.findall(r'```sh\n(.*?)```', text, re.S):
        for line in block.splitlines():
            commands.extend(x.strip() for x in line.split('&&') if x.strip())
    commands.extend(re.findall(r'\| `(python -m [^`]+)` \|', text))
    return commands


def readme_runs():
    runs = [c for c in readme_commands() if not any(
        without_env(c) == p or without_env(c).startswith(p + ' ')
        for p in NOT_RUN)]
    assert len(runs) >= 10, runs
    return runs


def test_readme_commands_are_all_known():
    """Every README command either runs below or is named in NOT_RUN."""
    commands = readme_commands()
    for command in map(without_env, commands):
        assert command.startswith('python -m embodied.') or any(
            command == p or command.startswith(p + ' ') for p in NOT_RUN), (
                command)
    assert any(c.startswith('python -m embodied.plot') for c in commands)


def as_test(command, tmp_path):
    """The README command's argv with its logdirs under `tmp_path` and, for
    DreamerV3 runs, at most STEPS env steps."""
    argv = shlex.split(command)
    assert argv[:2] == ['python', '-m'], command
    module, flags = argv[2], argv[3:]
    mapped = []
    for index, flag in enumerate(flags):
        if re.match(r'(~/)?logdir(/|$)', flag) or (
                index and flags[index - 1] == '--outdir'):
            flag = str(tmp_path / flag.removeprefix('~/'))
        mapped.append(flag)
    flags = mapped
    if module == 'embodied.plot':
        return module, flags
    if '--logdir' not in flags:
        flags += ['--logdir', str(tmp_path / 'logdir' / 'default')]
    dreamer = '--agent_impl' not in flags
    if dreamer:
        if '--run.steps' in flags:
            index = flags.index('--run.steps') + 1
            flags[index] = str(min(float(flags[index]), STEPS))
        else:
            flags += ['--run.steps', str(STEPS)]
    return module, flags


def write_scores(folder, scores):
    """A run folder as the JSONL output writes it, for the plot commands."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / 'scores.jsonl', 'w') as f:
        for i, score in enumerate(scores):
            f.write(json.dumps({
                'step': 100 * (i + 1), 'time': 2.0 * (i + 1),
                'episode/score': float(score)}) + '\n')


def slug(command):
    """A short test id for a README command."""
    words = command.split()[2:]
    return re.sub(r'[^A-Za-z0-9_.]+', '-', ' '.join(words))[:70].strip('-')


@pytest.mark.parametrize('command', readme_runs(), ids=slug)
def test_readme_command(tmp_path, command):
    module, flags = as_test(command, tmp_path)
    if module == 'embodied.plot':
        pytest.importorskip('matplotlib')
        logdir = tmp_path / 'logdir'
        # Runs as the README names them; a --label sweep gets runs whose
        # paths its regex matches.
        names = ('lr1e-4/seed0', 'lr3e-4/seed0') if '--label' in flags else (
            'cartpole', 'dreamer/seed0', 'dreamer/seed1', 'random/seed0')
        for name in names:
            write_scores(logdir / name, range(10))
        result = launch.run(*flags, module=module, timeout=TIMEOUT)
        assert result.returncode == 0, result.stdout[-3000:]
        outdir = pathlib.Path(
            flags[flags.index('--outdir') + 1] if '--outdir' in flags
            else flags[0])
        name = flags[flags.index('--name') + 1] if '--name' in flags else (
            'curves')
        assert (outdir / f'{name}.png').exists(), result.stdout[-3000:]
        return
    if '--run.from_checkpoint' in flags:
        # Watches the run of the README's command before it, made here.
        source = flags[flags.index('--run.from_checkpoint') + 1]
        before = readme_runs()[readme_runs().index(command) - 1]
        _, first = as_test(before, tmp_path)
        assert str(source) == first[first.index('--logdir') + 1], before
        run(*first, module=module, dreamer=False)
    dreamer = '--agent_impl' not in flags
    output = run(*flags, module=module, dreamer=dreamer)
    assert re.search(r'Reached run\.steps|\[Summary\]', output), output[-3000:]
    if '--logger.outputs' in flags and 'tensorboard' in flags:
        logdir = pathlib.Path(flags[flags.index('--logdir') + 1])
        assert list(logdir.glob('events.out.tfevents.*')), list(logdir.iterdir())
    if '--run.eval_video' in flags:
        logdir = pathlib.Path(flags[flags.index('--logdir') + 1])
        assert list((logdir / 'videos').glob('*.gif')), output[-3000:]


if __name__ == '__main__':
    for line in readme_commands():
        print(line)
    sys.exit(0)


# docs/devices.md: runs on meshes of 8 mock CPU devices


DEVICES = launch.ROOT / 'docs' / 'devices.md'


# Commands of docs/devices.md not run here, and why.
DEVICES_NOT_RUN = {
    'python -m embodied.perf.agent_speed --configs size12m': (
        'compiles size12m on 8 mock devices for minutes; the same command '
        'at debug runs here'),
}


def devices_commands(everything=False):
    commands = [
        line.strip()
        for block in re.findall(r'```sh\n(.*?)```', DEVICES.read_text(), re.S)
        for line in block.splitlines() if line.strip()]
    if everything:
        return commands
    return [c for c in commands if not any(
        c.startswith(p + ' ') for p in DEVICES_NOT_RUN)]


def test_devices_page_trains_on_a_mesh():
    assert len(devices_commands(everything=True)) == len(
        devices_commands()) + len(DEVICES_NOT_RUN)
    commands = devices_commands()
    assert any(
        '--script train' in c and '--jax.train_mesh 2,2,2' in c and
        '--jax.mock_devices 8' in c for c in commands), commands
    assert any('--script parallel' in c for c in commands), commands


@pytest.mark.parametrize('command', devices_commands(), ids=slug)
def test_devices_command(tmp_path, command):
    module, flags = as_test(command, tmp_path)
    if module == 'embodied.perf.agent_speed':
        flags = flags[:flags.index('--logdir')]  # not a flag it takes
        output = run(*flags, module=module, dreamer=False)
        for mesh in ('8,1,1', '1,8,1'):
            assert f'| ours {mesh} |' in output, output[-3000:]
        return
    output = run(*flags, module=module)
    assert 'Reached run.steps' in output or 'parallel' in command, (
        output[-3000:])
    logdir = pathlib.Path(flags[flags.index('--logdir') + 1])
    assert launch.saved_tags(logdir, 'agent'), output[-3000:]
