"""Memory Maze: task names, and its tasks import without the old gym
package that memory-maze's own `__init__` needs. The env's images through
the parallel runner: tests/run/parallel/test_env_suites_parallel.py."""

import importlib.util
import subprocess
import sys

import pytest

import launch
from embodied.envs import memmaze

needs_memmaze = pytest.mark.skipif(
    importlib.util.find_spec('memory_maze') is None,
    reason='memory-maze is not installed')


def test_unknown_task_names_sizes_and_variants():
    with pytest.raises(ValueError, match="'8x8'.*9x9, 11x11.*9x9-HD"):
        memmaze.MemMaze('8x8')
    with pytest.raises(ValueError, match="'9x9-Huge'"):
        memmaze.MemMaze('9x9-Huge')


@needs_memmaze
def test_tasks_import_without_gym():
    code = (
        'import sys; from embodied.envs import memmaze; '
        'tasks = memmaze._tasks("9x9"); '
        'assert hasattr(tasks, "memory_maze_9x9"); '
        'assert "gym" not in sys.modules or '
        'importlib.util.find_spec("gym")')
    code = 'import importlib.util; ' + code
    result = subprocess.run(
        [sys.executable, '-c', code], capture_output=True, text=True,
        timeout=120, env=launch.env())
    assert result.returncode == 0, result.stderr[-2000:]
