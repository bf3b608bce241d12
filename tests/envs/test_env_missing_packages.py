"""A suite whose package is not installed stops the command in seconds
with one line that names the extra to install and what else it needs
or, for DeepMind Lab (not on PyPI), how to build it (minecraft, dmlab
and, below Python 3.13, procgen cannot be installed by CI's plain
`pip install '.[test]'`)."""

import importlib.util
import time

import pytest

import launch

CASES = {
    # task: (module, words of the line)
    'minecraft_diamond': ('minerl', (
        "pip install 'embodied[minecraft]'", 'Java 8', 'minerl')),
    'dmlab_explore_goal_locations_small': ('deepmind_lab', (
        'not on PyPI', 'Bazel', 'docs/users/build.md')),
    'procgen_coinrun': ('procgen_gym', (
        "pip install 'embodied[procgen]'", 'Python >= 3.13')),
}


@pytest.mark.parametrize('task', sorted(CASES))
@pytest.mark.parametrize('script', ['train', 'eval_only'])
def test_missing_package_says_what_to_install_and_exits_2(
        task, script, tmp_path):
    module, words = CASES[task]
    if importlib.util.find_spec(module):
        pytest.skip(f'{module} is installed')
    start = time.monotonic()
    result = launch.run(
        '--task', task, '--script', script, '--configs', 'debug',
        '--run.from_checkpoint', tmp_path / 'none', '--logdir',
        tmp_path / 'run', timeout=120)
    seconds = time.monotonic() - start
    assert result.returncode == 2, result.stdout[-3000:]
    assert 'Traceback' not in result.stdout, result.stdout[-3000:]
    errors = [line for line in result.stdout.splitlines()
              if line.startswith('error:')]
    assert len(errors) == 1, result.stdout[-3000:]
    assert f'--task {task} needs' in errors[0]
    for word in words:
        assert word in errors[0], errors[0]
    # No agent was built or compiled before the line.
    assert 'Compiled' not in result.stdout
    print(f'{task} {script}: exit 2 after {seconds:.1f} s')
