"""A user script that calls `combined` without a `__main__` guard: each
spawned worker re-imports it; the workers refuse to launch again and the
error says what to do."""

import subprocess

import launch

SCRIPT = '''
import sys
from functools import partial as bind
import embodied
from embodied import main as m
config = m.parse(sys.argv[1:])
embodied.run.parallel.combined(
    bind(m.make_agent, config), bind(m.make_replay, config, 'replay'),
    bind(m.make_replay, config, 'replay_eval', 'eval'),
    bind(m.make_env, config), bind(m.make_env, config),
    bind(m.make_stream, config), bind(m.make_logger, config),
    m.make_args(config))
'''


def test_unguarded_script_fails_with_the_guard_named(tmp_path):
    script = tmp_path / 'unguarded.py'
    script.write_text(SCRIPT)
    result = subprocess.run(
        launch.command(
            '--configs', 'debug', '--agent_impl', 'testing', '--task',
            'dummy_disc', '--run.envs', '1', '--run.eval_envs', '0', '--run.actor_batch', '1',
            '--run.steps', '50', '--logdir', tmp_path / 'run', script=script),
        cwd=launch.ROOT, env=launch.env(), timeout=240, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert result.returncode != 0
    assert "call combined() under `if __name__ == '__main__':`" in (
        result.stdout), result.stdout[-3000:]
    assert result.stdout.count('Launching') == 1, result.stdout[-3000:]
