"""`launch_time --script parallel --quick`: a cold and a warm launch of the
parallel runner, each ended once it printed its first env step, first train
step and compile time."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quick_parallel_launches_cold_and_warm():
    result = subprocess.run(
        [sys.executable, '-m', 'embodied.perf.launch_time', '--script',
         'parallel', '--quick'], cwd=ROOT, capture_output=True, text=True,
        timeout=1500, env={**os.environ, 'JAX_PLATFORMS': 'cpu'})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = re.findall(
        r'^\| working tree \| (cold|warm) \| ([\d.]+) \| ([\d.]+) \| '
        r'([\d.]+) \|$', result.stdout, re.M)
    assert [row[0] for row in rows] == ['cold', 'warm'], result.stdout
    for _, *figures in rows:
        assert all(float(x) > 0 for x in figures), rows
