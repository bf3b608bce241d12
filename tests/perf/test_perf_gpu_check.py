"""`gpu_check --quick`: the GPU machine's one command, at `debug` on CPU."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quick_check_gives_agent_speed_a_run_and_a_relaunch(tmp_path):
    table = tmp_path / 'table.md'
    result = subprocess.run(
        [sys.executable, '-m', 'embodied.perf.gpu_check', '--quick',
         '--markdown', str(table)], cwd=ROOT, capture_output=True, text=True,
        timeout=900, env={**os.environ, 'JAX_PLATFORMS': 'cpu'})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    text = table.read_text()
    assert text.startswith('gpu_check on cpu, --configs debug')
    rows = dict(re.findall(r'^\| ([^|]+) \| ([^|]+) \|$', text, re.M))
    speed = rows['agent_speed: ours']
    assert float(re.search(r'([\d.]+) train steps/s', speed).group(1)) > 0
    run = next(v for k, v in rows.items() if k.startswith('parallel, 4 envs'))
    assert float(re.search(r'(\d+) env steps/s', run).group(1)) > 0
    assert 'GPU busy –' in run  # No nvidia-smi here.
    relaunch = rows['relaunch (resume, compile cache)']
    compile_s, first = re.search(
        r'compile ([\d.]+) s, first env step ([\d.]+) s', relaunch).groups()
    assert 0 < float(compile_s) < float(first)
