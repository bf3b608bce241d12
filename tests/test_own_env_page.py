"""docs/own-environment.md as a user reads it: every shell command of the
page runs exactly as written, from a folder that holds the checkout's
`examples/` (so the page's relative paths hold and its logdirs land in the
test's folder), and each run must have trained: it reached its steps, wrote
finite `train/loss/*` metrics and episode scores, and saved the agent. The
page's Python excerpts must be parts of the files they name.

The corridor's spaces are those of `cartpole_balance` (a `vector` of 4
floats, 2 actions), so its `debug` agent compiles the same programs as the
suite's other `debug` runs and loads them from the compilation cache those
filled."""

import math
import re
import shlex
import subprocess
import sys

import pytest

import launch
from tests.test_user_paths import env_of, page_commands, without_env

PAGE = launch.ROOT / 'docs' / 'own-environment.md'
TIMEOUT = 600


def commands():
    return [c for c in page_commands(PAGE.read_text())
            if not without_env(c).startswith('pip ')]


def test_page_runs_each_example_under_the_parallel_runner():
    runs = commands()
    for task in ('corridor_gym:Corridor', 'corridor_dm:Corridor',
                 'corridor:Corridor'):
        assert any(f'--script parallel --task {task} ' in c for c in runs), (
            task, runs)
    assert any('examples/own_env/corridor_script.py' in c for c in runs)


def test_page_excerpts_are_the_example_files():
    excerpts = re.findall(
        r'```python\n# (\S+) \(.*?\)\n(.*?)```', PAGE.read_text(), re.S)
    assert len(excerpts) >= 2, excerpts
    for path, code in excerpts:
        assert code in (launch.ROOT / path).read_text(), path


def run_as_written(command, folder):
    """Runs `command` in `folder` with the page's variables added (a
    PYTHONPATH in front of the test's); returns its exit code and output."""
    argv = shlex.split(without_env(command))
    assert argv[0] == 'python', command
    env = launch.env()
    for name, value in env_of(command).items():
        env[name] = (f"{value}:{env[name]}" if name == 'PYTHONPATH'
                     else value)
    result = subprocess.run(
        [sys.executable, *argv[1:]], cwd=folder, env=env, timeout=TIMEOUT,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return result.returncode, result.stdout


@pytest.mark.slow
@pytest.mark.parametrize('command', commands(), ids=lambda c: re.search(
    r'logdir/(\S+)', c).group(1))
def test_page_command_trains(tmp_path, command):
    (tmp_path / 'examples').symlink_to(launch.ROOT / 'examples')
    code, output = run_as_written(command, tmp_path)
    assert code == 0, output[-4000:]
    assert 'Traceback' not in output, output[-4000:]
    steps = int(re.search(r'--run\.steps (\d+)', command).group(1))
    assert f'Reached run.steps ({steps})' in output, output[-3000:]
    assert '[Summary]' in output, output[-3000:]
    logdir = tmp_path / re.search(r'--logdir (\S+)', command).group(1)
    losses = [value for row in launch.metrics(logdir)
              for key, value in row.items() if key.startswith('train/loss/')]
    assert losses and all(math.isfinite(x) for x in losses), output[-3000:]
    scores = launch.metrics(logdir, 'scores.jsonl')
    assert any('episode/score' in row for row in scores), scores
    assert launch.saved_tags(logdir, 'agent')[-1] >= steps, output[-3000:]
