"""The soak benchmark: its 1-minute variant end to end, and its checks."""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from devtools import soak

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_one_minute_soak_relaunches_and_resumes_at_the_newest_save():
    result = subprocess.run(
        [sys.executable, '-m', 'devtools.soak', '--minutes', '1',
         '--agent', 'testing', '--save_every', '5', '--kill_every', '12',
         '--term_every', '25', '--tree_kill_at', '40', '--window', '15',
         '--warmup', '5', '--sample_every', '5'],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, 'JAX_PLATFORMS': 'cpu'})
    output = result.stdout + result.stderr
    # Without the per-sample lines, for the messages of failed asserts.
    output = '\n'.join(line for line in output.splitlines()
                       if not re.match(r'\[soak\] t=\d+ s: launch \d+, ', line))
    assert result.returncode == 0, output[-4000:]
    assert 'Soak passed.' in output, output[-4000:]
    launches = re.findall(
        r'^\| (\d) \| [\d.]+ \| ([^|]+) \| (-?\d+) \| (\w+) \| (\w+) \|',
        output, re.M)
    ended = [launch[1].strip() for launch in launches]
    assert ended == ['SIGTERM', 'SIGKILL of the tree', 'run.duration'], (
        output[-4000:])
    for index, _, _, resumed, newest in launches[1:]:
        assert resumed == newest != 'None', output[-4000:]
    assert re.search(r'^resumes: pass', output, re.M)
    assert re.search(r'^restarts: pass: [1-9]\d* env kills', output, re.M)


def write_rows(path, rows):
    path.write_text(''.join(json.dumps(row) + '\n' for row in rows))


def test_metrics_check_finds_steps_going_back_and_repeated_rows(tmp_path):
    periodic = [{'step': step, 'fps/env': 1.0} for step in (0, 10, 20, 30)]
    write_rows(tmp_path / 'metrics.jsonl', periodic)
    assert soak.check_metrics(tmp_path)[0]
    back = periodic[:3] + [{'step': 15, 'episode/score': 1.0}] + periodic[3:]
    write_rows(tmp_path / 'metrics.jsonl', back)
    ok, detail = soak.check_metrics(tmp_path)
    assert not ok and 'goes back' in detail
    write_rows(tmp_path / 'metrics.jsonl', periodic[:3] + periodic[2:])
    ok, detail = soak.check_metrics(tmp_path)
    assert not ok and 'two periodic rows at step 20' in detail
    gap = periodic + [{'step': 500, 'fps/env': 1.0}]
    write_rows(tmp_path / 'metrics.jsonl', gap)
    ok, detail = soak.check_metrics(tmp_path)
    assert not ok and 'gap of 470 steps' in detail


def test_flat_check_fails_on_growth_after_the_settled_window():
    args = soak.make_parser().parse_args(['--settle', '60', '--window', '30'])
    row = lambda a, rss, fds: {
        'a': a, 'steady': 3, 'launcher': rss, 'Replay': rss, 'Logger': rss,
        'env worker': rss, 'all': rss, 'fds': fds}
    rows = [row(0, 50, 90), row(30, 80, 95), row(60, 100, 100),
            row(90, 105, 104), row(120, 109, 108)]
    ok, _ = soak.check_flat(rows, args, 150)
    assert ok
    rows.append(row(150, 100, 115))
    ok, detail = soak.check_flat(rows + [row(180, 100, 100)], args, 210)
    assert not ok and 'fds grew 15.0%' in detail


def test_logdir_check_allows_a_recent_set_aside_save_but_no_leftover(
        tmp_path):
    def save(role, name):
        folder = tmp_path / 'ckpt' / role / name
        folder.mkdir(parents=True)
        (folder / f'{role}.pkl').write_bytes(b'x' * 100)
        (folder / 'done').write_text('{}')

    for role in ('agent', 'replay', 'logger'):
        for step in (200, 300, 400):
            save(role, f'{step:012d}')
    ok, detail = soak.check_logdir(tmp_path, None)
    assert ok, detail
    # Set aside on resume at 200 and still newer than the oldest kept save.
    save('agent', 'unused-000000000250-0a1b2c3d')
    ok, detail = soak.check_logdir(tmp_path, None)
    assert ok and "{'agent': 1, 'replay': 0, 'logger': 0}" in detail, detail
    # Older than every kept save: pruning should have removed it.
    save('logger', 'unused-000000000150-0a1b2c3d')
    ok, detail = soak.check_logdir(tmp_path, None)
    assert not ok and 'logger/unused-000000000150-0a1b2c3d' in detail
    shutil.rmtree(
        tmp_path / 'ckpt' / 'logger' / 'unused-000000000150-0a1b2c3d')
    assert soak.check_logdir(tmp_path, None)[0]
    save('replay', f'{500:012d}')
    ok, detail = soak.check_logdir(tmp_path, None)
    assert not ok and "'replay': 4" in detail, detail
