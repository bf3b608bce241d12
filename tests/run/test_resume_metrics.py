"""A resumed run's metrics never go back in steps: lines written after the
save it resumes from are moved aside, not repeated."""

import json

import elements
import numpy as np
import pytest

import launch
from embodied import outputs
from embodied.run import saving
from tests.run.parallel.test_parallel import Tree
from embodied import rpc

COMMON = (
    '--configs', 'debug', '--agent_impl', 'testing', '--task', 'dummy_disc',
    '--run.envs', '2', '--run.eval_envs', '0', '--logger.outputs', 'jsonl')


def steps_of(logdir, name='metrics.jsonl'):
    return [row['step'] for row in launch.metrics(logdir, name)]


def assert_never_back(steps):
    back = [(a, b) for a, b in zip(steps, steps[1:]) if b < a]
    assert not back, f'steps go back: {back[:5]}'


def test_rewind_moves_later_lines_aside(tmp_path):
    out = outputs.JSONLOutput(tmp_path, parallel=False)
    out([(step, 'x', np.float32(step)) for step in (10, 20, 30, 40)])
    logger = elements.Logger(elements.Counter(), [out])
    saving.rewind_outputs(logger, 20)
    assert steps_of(tmp_path) == [10, 20]
    moved = [json.loads(x)['step'] for x in (
        tmp_path / 'metrics.rewound.jsonl').read_text().splitlines()]
    assert moved == [30, 40]
    out([(25, 'x', np.float32(1))])
    assert steps_of(tmp_path) == [10, 20, 25]
    times = [row['time'] for row in launch.metrics(tmp_path)]
    assert times == sorted(times)


def kill_after_metrics_then_resume(tmp_path, script, module, *flags):
    logdir = tmp_path / 'run'
    run = launch.Launch(
        '--script', script, *COMMON, *flags, '--run.steps', '1e9',
        '--run.save_every', '1e6', '--logdir', logdir,
        logfile=tmp_path / 'first.log', module=module)
    tree = Tree(run.proc)
    try:
        run.wait_for(lambda: tree.record() and max(
            steps_of(logdir), default=0) >= 300, timeout=240,
            what='metrics beyond the first save')
        rpc.workers.kill_tree(run.proc.pid)
        run.wait(10)
    finally:
        run.kill()
    saved = launch.saved_tags(logdir, 'logger')[-1]
    assert max(steps_of(logdir)) > saved  # Lines the resume must not repeat.
    result = launch.run(
        '--script', script, *COMMON, *flags, '--run.steps', saved + 300,
        '--logdir', logdir, module=module)
    assert result.returncode == 0, result.stdout[-3000:]
    steps = steps_of(logdir)
    assert max(steps) >= saved + 300
    assert_never_back(steps)
    assert_never_back(steps_of(logdir, 'scores.jsonl'))


@pytest.mark.slow
def test_train_resume_after_kill_repeats_no_step(tmp_path):
    kill_after_metrics_then_resume(
        tmp_path, 'train', 'embodied.main', '--run.log_every', '1')


@pytest.mark.slow
def test_parallel_resume_after_kill_repeats_no_step(tmp_path):
    kill_after_metrics_then_resume(
        tmp_path, 'parallel', 'embodied.run.parallel', '--run.log_every',
        '1')
