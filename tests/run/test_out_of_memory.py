"""A program of the agent that asks a device for more memory than it has
(XLA's RESOURCE_EXHAUSTED) ends the run with one line: which program, what
it asked for, the settings that lower it and the last complete save; exit
code 71, no traceback, and the save intact: a rerun resumes from it.

The runs go through `tests/support/oom_main.py`, which has the agent ask
the CPU for a petabyte inside its train step or its policy once the run
has saved past step 0: JAX raises its own error with XLA's own message.
Under `--script parallel`, the policy runs out in the actor's thread of the
launcher's process, and train in the learner of an agent process beside a
policy process."""

import re
import subprocess

import jax.numpy as jnp
import numpy as np
import pytest

import launch
from embodied import rpc
from embodied.core import checkpoint as cplib
from embodied.core import outofmemory
from embodied.run import ending
from embodied.run import saving
from tests.run.parallel.test_parallel import Tree, finish

OOM_MAIN = launch.SUPPORT / 'oom_main.py'
FLAGS = ('--configs', 'debug', '--run.steps', '1e9', '--run.save_every', '3',
         '--run.log_every', '5')
PETABYTE = 2 ** 50
XLA_CPU = f'RESOURCE_EXHAUSTED: Out of memory allocating {PETABYTE} bytes.'


def real_error():
    """The error JAX raises when the CPU cannot give what a program asks."""
    try:
        jnp.ones((PETABYTE,), jnp.uint8).block_until_ready()
    except Exception as e:
        return e
    raise AssertionError('a petabyte was allocated')


def test_a_program_names_itself_on_xlas_error():
    @outofmemory.program('train')
    def train():
        raise real_error()

    with pytest.raises(outofmemory.DeviceMemoryError) as info:
        train()
    error = info.value
    assert (error.program, error.requested) == ('train', PETABYTE)
    assert str(error) == (
        f'Out of device memory in train (asked for {PETABYTE} bytes): '
        f'{XLA_CPU}')
    assert type(error.__cause__).__name__ == 'JaxRuntimeError'

    @outofmemory.program('report')
    def outer():  # The inner program's name stays.
        train()

    with pytest.raises(outofmemory.DeviceMemoryError) as info:
        outer()
    assert info.value.program == 'train'

    @outofmemory.program('policy')
    def other():
        raise ValueError('RESOURCE_ nothing')

    with pytest.raises(ValueError):
        other()


def test_find_reads_the_error_across_processes_and_xlas_wordings():
    inner = outofmemory.from_text(XLA_CPU, 'policy')
    worker = rpc.WorkerFailed(
        'Agent', outofmemory.EXIT_CODE,
        f'_ThreadFailed: The actor thread failed: RemoteError: Actor.act '
        f'failed: DeviceMemoryError: {inner}')
    assert outofmemory.find(RuntimeError('ended')) is None
    found = outofmemory.find(worker)
    assert (found.program, found.requested) == ('policy', PETABYTE)
    assert found.xla_message == XLA_CPU
    gpu = ('RESOURCE_EXHAUSTED: Failed to allocate request for 2.00GiB '
           '(2147483648B) on device ordinal 0\nBFCAllocator stats ...')
    found = outofmemory.find(RuntimeError(gpu))
    assert (found.program, found.requested) == (None, 2 ** 31)
    assert found.xla_message == gpu.splitlines()[0]
    assert outofmemory.requested_bytes(
        'RESOURCE_EXHAUSTED: Out of memory while trying to allocate '
        '8.00GiB.') == 8 * 2 ** 30
    assert outofmemory.requested_bytes(
        'RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm.') is None


@pytest.mark.parametrize('program, knob', [
    ('train', '--batch_size (now 8) or --batch_length (now 12)'),
    ('report', '--report_length (now 8) or --batch_size (now 8)'),
    ('policy', '--run.actor_batch (now 2; --script parallel) or '
               '--run.envs (now 4)'),
    (None, '--batch_size (now 8)'),
])
def test_the_line_names_program_amount_knobs_and_save(
        tmp_path, program, knob):
    from embodied import config as configlib
    from embodied import factories
    config = configlib.build(['debug']).update(logdir=str(tmp_path))
    args = factories.make_args(config)
    error = outofmemory.from_text(XLA_CPU, program)
    line = ending.out_of_memory_line(args, error)
    what = outofmemory.PROGRAMS.get(program, 'a program of the agent')
    assert line.startswith(
        f'Out of device memory in {what} (it asked for 1.0 PiB '
        f'({PETABYTE} bytes); {XLA_CPU}). Lower it with {knob}'), line
    for key in ('--configs size12m', '--jax.prealloc False',
                'docs/devices.md'):
        assert key in line, line
    mesh = '--jax.policy_mesh' if program == 'policy' else '--jax.train_mesh'
    assert mesh in line, line
    assert 'There is no complete save in' in line, line
    assert line.endswith('Exiting with code 71.') and '\n' not in line


@pytest.mark.parametrize('program, share', [
    ('policy', '--run.policy_memory (now 0.15;'),
    ('train', '--run.agent_memory (now 0.6;'),
])
def test_with_a_policy_worker_the_line_names_its_gpu_share(
        tmp_path, program, share):
    from embodied import config as configlib
    from embodied import factories
    config = configlib.build(['debug']).update({
        'logdir': str(tmp_path), 'run.policy_worker': 'process'})
    line = ending.out_of_memory_line(
        factories.make_args(config), outofmemory.from_text(XLA_CPU, program))
    assert f'a larger share of the GPU for its process, {share}' in line, line
    thread = configlib.build(['debug']).update(logdir=str(tmp_path))
    line = ending.out_of_memory_line(
        factories.make_args(thread), outofmemory.from_text(XLA_CPU, program))
    assert 'share of the GPU' not in line, line


def check_ended(code, output, what):
    """The run's end: exit code 71 and its line, no traceback; returns the
    step of the save the line names."""
    assert code == outofmemory.EXIT_CODE, output[-4000:]
    assert 'Traceback' not in output, output[-4000:]
    lines = [x for x in output.splitlines() if x.startswith('error: ')]
    assert len(lines) == 1, output[-4000:]
    match = re.fullmatch(
        rf'error: Out of device memory in {re.escape(what)} \(it asked for '
        rf'1\.0 PiB \({PETABYTE} bytes\); {re.escape(XLA_CPU)}\)\. Lower it '
        r'with .*\. The last complete save, step (\d+) in (\S+)/ckpt, is '
        r'intact and a rerun of the same command resumes from it\. Exiting '
        r'with code 71\.', lines[0])
    assert match, lines[0]
    return int(match.group(1))


@pytest.mark.slow
def test_train_ends_in_one_line_and_a_rerun_resumes(tmp_path, monkeypatch):
    logdir = tmp_path / 'run'
    monkeypatch.setenv('EMBODIED_TEST_OOM', 'train')
    result = subprocess.run(
        launch.command(*FLAGS, '--script', 'train', '--logdir', logdir,
                       script=OOM_MAIN),
        env=launch.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, timeout=600)
    step = check_ended(result.returncode, result.stdout, 'the train step')
    assert step > 0 and saving.resume_tag(logdir, report=False) == step
    result = launch.run(
        '--configs', 'debug', '--script', 'train', '--logdir', logdir,
        '--run.steps', str(step + 40))
    assert result.returncode == 0, result.stdout[-4000:]
    assert f'Resumed from the save at step {step}.' in result.stdout


PARALLEL = {
    # program: where it runs
    'policy': ('--run.policy_worker', 'thread'),  # the launcher's thread
    'train': ('--run.policy_worker', 'process',  # each in a process
              '--run.agent_process', 'True'),
}


@pytest.mark.slow
@pytest.mark.parametrize('program', sorted(PARALLEL))
def test_parallel_ends_in_one_line_with_its_saves_intact(
        tmp_path, monkeypatch, program):
    logdir = tmp_path / 'run'
    monkeypatch.setenv('EMBODIED_TEST_OOM', program)
    run = launch.Launch(
        *FLAGS, '--script', 'parallel', '--run.eval_envs', '0',
        *PARALLEL[program], '--logdir', logdir, script=OOM_MAIN,
        logfile=tmp_path / 'run.log')
    try:
        code, output = finish(run, Tree(run.proc), timeout=600)
    finally:
        run.kill()
    step = check_ended(code, output, outofmemory.PROGRAMS[program])
    assert step > 0 and saving.resume_tag(logdir, report=False) == step
    data = {}
    cplib.read(saving.directory(logdir, 'agent') / f'{step:012d}',
               {'agent': data.update})
    assert data and all(np.isfinite(v).all() for k, v in data.items()
                        if np.asarray(v).dtype.kind == 'f'), sorted(data)
