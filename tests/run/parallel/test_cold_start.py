"""The first lines of a parallel launch on an empty compilation cache: the
agent says what it compiles and that the cache is cold, the env workers of
the launch wait quietly while the launcher prints one line per
run.wait_report, the policy is ready before train and report, and the
`Compiled the agent` line ends the compile. A SIGTERM then still saves
every role and exits 0."""

import re
import signal
import subprocess
import threading
import time

import pytest

import launch

WAIT_REPORT = 3


@pytest.mark.slow
def test_cold_start_lines(tmp_path):
    cache = tmp_path / 'cache'
    env = {**launch.env(), 'EMBODIED_JAX_CACHE': str(cache)}
    proc = subprocess.Popen(
        launch.command(
            '--script', 'parallel', '--configs', 'debug', '--task',
            'cartpole_balance', '--run.envs', 2, '--run.eval_envs', 0,
            '--run.wait_report', WAIT_REPORT, '--run.log_every', 1e9,
            '--run.save_every', 1e9, '--logdir', tmp_path / 'run'),
        cwd=launch.ROOT, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    lines = []
    seen = threading.Event()

    def read():
        for line in proc.stdout:
            lines.append((time.monotonic(), line.rstrip('\n')))
            text = '\n'.join(x for _, x in lines)
            if 'Compiled the agent in' in text and 'First env step' in text:
                seen.set()
        seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert seen.wait(900), '\n'.join(x for _, x in lines)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(300) == 0, '\n'.join(x for _, x in lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(30)
    output = [x for _, x in lines]
    text = '\n'.join(output)

    agent = [x for x in output if x.startswith(('Agent:', 'Compiled'))]
    assert agent[0] == (
        f'Agent: compiling the parameters, the policy at batch sizes '
        f'train [2], then train and report in the background while the '
        f'policy acts; the compilation cache at {cache} is empty (a cold '
        f'start).'), text
    ready = [i for i, x in enumerate(agent)
             if x.startswith('Agent: the policy is compiled')]
    done = [i for i, x in enumerate(agent)
            if x.startswith('Compiled the agent in')]
    assert ready and done and ready[0] < done[0], text
    for line in agent:
        match = re.fullmatch(
            r'Agent: compiling .*, (\d+) s since compiling started\.', line)
        assert match or not line.startswith('Agent: compiling ') or (
            line == agent[0]), line

    # The env workers of the launch stay quiet; the launcher's one line per
    # run.wait_report says how long it has waited.
    assert not [x for x in output if re.match(r'Env\d+.*waiting', x)], text
    waited = [int(m.group(1)) for m in (
        re.search(r'^Launcher: .*waited (\d+) s so far\.$', x)
        for x in output) if m]
    # (The launcher's clients of the other roles name themselves
    # `LauncherLogger` and so on, and say so too when a server is slow.)
    launcher = [x for x in output if x.startswith('Launcher:')]
    assert len(waited) == len(launcher), launcher
    assert all(b - a >= WAIT_REPORT for a, b in zip(waited, waited[1:])), (
        waited)
    assert 'A.L.E' not in text

    # The stop during or after the compile saved every role.
    assert 'Saved checkpoints at step' in text
    for role in ('agent', 'replay', 'logger'):
        assert any((tmp_path / 'run' / 'ckpt' / role).iterdir()), role
