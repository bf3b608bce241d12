"""`gpu_check --quick`: the GPU machine's one command, at `debug` on CPU."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quick_check_gives_every_row(tmp_path):
    """Each step of the check runs: the cold parallel launch, the relaunch
    (a resume that compiles nothing anew), a resume in each mode of
    run.policy_worker, agent_speed, the default-size
    launch (with --quick on the runs' warm cache: its configs are theirs)
    and the policy probe."""
    table = tmp_path / 'table.md'
    result = subprocess.run(
        [sys.executable, '-m', 'embodied.perf.gpu_check', '--quick',
         '--markdown', str(table)], cwd=ROOT, capture_output=True, text=True,
        timeout=1500, env={**os.environ, 'JAX_PLATFORMS': 'cpu'})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    text = table.read_text()
    assert text.startswith('gpu_check on cpu, --configs debug')
    rows = dict(re.findall(r'^\| ([^|]+) \| ([^|]+) \|$', text, re.M))
    run = next(v for k, v in rows.items() if k.startswith('parallel, 4 envs'))
    assert float(re.search(r'(\d+) env steps/s', run).group(1)) > 0
    assert 'GPU busy –' in run  # No nvidia-smi here.
    first_env, first_train = (float(x) for x in re.search(
        r'first env step ([\d.]+) s, first train step ([\d.]+) s', run
    ).groups())
    assert 0 < first_env and 0 < first_train
    relaunch = rows['relaunch (resume, warm cache)']
    compile_s, anew, first = re.search(
        r'compile ([\d.]+) s, (\d+) programs compiled anew, first env step '
        r'([\d.]+) s', relaunch).groups()
    assert 0 < float(compile_s) and 0 < float(first)
    assert anew == '0', relaunch  # The resume's programs all came cached.
    for mode in ('thread', 'process'):
        row = rows[f'parallel, 4 envs, run.policy_worker {mode}, 20 s, '
                   f'warm cache (resume)']
        assert float(re.search(r'(\d+) env steps/s', row).group(1)) > 0, row
    # The targets, against both mode runs (no steady window or GPU
    # utilization in runs this short on CPU: those cells may stay open).
    learner = re.search(
        r'^\| learner at least 85% of standalone \| (\d+)% \| (\d+)% \|',
        text, re.M)
    assert learner, text
    speed = rows['agent_speed: ours (warm cache)']
    assert float(re.search(r'([\d.]+) train steps/s', speed).group(1)) > 0
    default = next(v for k, v in rows.items()
                   if k.startswith('parallel at debug, warm cache'))
    assert re.search(r'compile [\d.]+ s, first env step [\d.]+ s', default)
    probe = rows['policy in a second process, batch 16']
    figures = re.search(
        r'p50 ([\d.]+) ms, p95 ([\d.]+) ms while the other process trains '
        r'at ([\d.]+) train steps/s .*alone p50 ([\d.]+) ms', probe)
    assert figures and all(float(x) > 0 for x in figures.groups()), probe


def test_the_targets_compare_both_modes_against_the_agent_alone():
    from embodied.perf import gpu_check
    speed = {'train_rate': 20.0, 'policy_p50_ms': 2.0}
    thread = dict(train_fps=14.0, policy_batch_ms=26.0, gpu_busy=80.0,
                  steady_fps=500.0)
    process = dict(train_fps=18.0, policy_batch_ms=3.0, gpu_busy=None,
                   steady_fps=700.0)
    table = gpu_check.targets_table(
        {'thread': thread, 'process': process}, speed)
    rows = [line.strip('| ').split(' | ') for line in table.splitlines()[2:]]
    assert [r[1:] for r in rows] == [
        ['70%', '90%', 'yes'], ['13.0x', '1.5x', 'yes'],
        ['80%', '–', '–'],  # No GPU utilization: not measured.
        ['500', '700 (1.40x)', 'yes']]
    # A mode that did not run leaves its cells and the verdicts open.
    table = gpu_check.targets_table(
        {'thread': thread, 'process': gpu_check.NO_KEY}, speed)
    assert table.splitlines()[2].endswith('| 70% | – | – |')


def test_a_mode_run_that_cannot_run_or_fails_is_a_row_not_the_end(
        monkeypatch, tmp_path):
    from embodied.perf import gpu_check
    args = gpu_check.make_parser().parse_args([])
    monkeypatch.setattr(gpu_check, 'knows_policy_worker', lambda: False)
    assert gpu_check.run_mode(
        args, 'cpu', tmp_path, tmp_path, 'process', 10) == gpu_check.NO_KEY

    def fails(*args):
        assert args[-1] == ('--run.policy_worker', 'process')
        raise RuntimeError('exited with 1:\nTraceback\nValueError: a | b\n')

    monkeypatch.setattr(gpu_check, 'knows_policy_worker', lambda: True)
    monkeypatch.setattr(gpu_check, 'run_parallel', fails)
    assert gpu_check.run_mode(args, 'cpu', tmp_path, tmp_path, 'process',
                              10) == 'failed: ValueError: a / b'
