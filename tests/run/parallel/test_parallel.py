"""The parallel runner end to end on the command line, with the test agent.

The test agent fails the run when `count` arrives out of order in a policy
input or a train/report batch, so every run here also checks data integrity.
"""

import functools
import os
import re
import signal
import time

import psutil
import pytest

import launch
import metrics_reference

MODULE = 'embodied.run.parallel'
COMMON = (
    '--configs', 'debug', '--agent_impl', 'testing', '--task', 'dummy_disc',
    '--run.log_every', '1', '--run.report_every', '2',
    '--replay.size', '3000', '--logger.outputs', 'jsonl')


def start(logdir, *flags, script='parallel', name='run', module=MODULE):
    return launch.Launch(
        '--script', script, *COMMON, '--logdir', logdir, *flags,
        logfile=logdir.parent / f'{name}.log', module=module)


class Tree:
    """The processes a launch started, recorded while it runs."""

    def __init__(self, proc):
        self.root = psutil.Process(proc.pid)
        self.seen = {}

    def record(self):
        try:
            for child in self.root.children(recursive=True):
                self.seen[child.pid] = child
        except psutil.NoSuchProcess:
            pass
        return len(self.seen)

    def left(self, grace=5):
        """Processes of the launch still alive `grace` seconds after it
        exited (children see their parent's exit a moment later)."""
        deadline = time.monotonic() + grace
        while True:
            alive = [p.pid for p in self.seen.values() if _alive(p)]
            if not alive or time.monotonic() > deadline:
                return alive
            time.sleep(0.05)


def _alive(proc):
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def finish(run, tree, timeout=240):
    """Waits for the launch to exit while recording its process tree."""
    deadline = time.monotonic() + timeout
    while run.proc.poll() is None and time.monotonic() < deadline:
        tree.record()
        time.sleep(0.2)
    code = run.wait(max(1, deadline - time.monotonic()))
    output = run.output()
    left = tree.left()
    assert not left, f'processes left behind: {left}'
    return code, output


def summary(output):
    """The launcher's final `[Summary] key=value ...` line as numbers."""
    line = re.findall(r'\[Summary\] (.*)', output)[-1]
    return {k: float(v) for k, v in (x.split('=') for x in line.split())}


def progress_step(output):
    steps = re.findall(r'\[Progress\] step (\d+)/', output)
    return int(steps[-1]) if steps else 0


def finish_all(runs, timeout=240):
    """Waits for launches that must all end cleanly; returns their outputs."""
    trees = [Tree(run.proc) for run in runs]
    try:
        results = [finish(run, tree, timeout) for run, tree in zip(runs, trees)]
    finally:
        for run in runs:
            run.kill()
    for code, output in results:
        assert code == 0, output[-4000:]
        assert 'Traceback' not in output, output[-4000:]
    return [output for _, output in results]


def run_to_end(logdir, *flags, timeout=300, name='run', during=None):
    """Runs a launch that must end cleanly, calling `during(run, tree)` on
    the way; returns its output."""
    run = start(logdir, *flags, name=name)
    tree = Tree(run.proc)
    try:
        if during:
            during(run, tree)
        code, output = finish(run, tree, timeout)
    finally:
        run.kill()
    assert code == 0, output[-4000:]
    assert 'Traceback' not in output, output[-4000:]
    assert tree.seen, 'the launch started no processes'
    return output


@pytest.mark.slow
def test_runs_to_steps_with_ratio_saves_and_eval_split(tmp_path):
    logdir = tmp_path / 'run'
    output = run_to_end(
        logdir, '--run.steps', '2000', '--run.envs', '4',
        '--run.eval_envs', '1', '--run.save_every', '2',
        '--run.report_every', '1',  # The run can end within debug's 10 s.
        '--run.train_ratio', '32', '--testing.replay_outs', 'True')
    assert 'Reached run.steps (2000)' in output
    assert 'All workers exited.' in output
    # Every save found the actor drained (its held transitions sent).
    assert 'in flight' not in output and 'Skipping this save' not in output
    if os.path.isdir('/dev/shm'):
        # Train batches came through shared memory, and every one of them
        # passed the test agent's content checks.
        assert summary(output)['shared_batches'] > 0, output[-3000:]

    tags = {role: launch.saved_tags(logdir, role)
            for role in ('agent', 'replay', 'logger')}
    assert tags['agent'] == tags['replay'] == tags['logger'], tags
    assert tags['agent'][-1] >= 2000
    saves = re.findall(r'Saved checkpoints at step (\d+)', output)
    assert len(saves) >= 2, 'no periodic save before the final one'

    # Every train step reached the train replay, eval steps only the eval one.
    step = launch.latest_value(logdir, 'parallel_replay/inserts')
    assert step == tags['logger'][-1]
    assert launch.latest_value(logdir, 'parallel_replay/eval_inserts') > 0
    assert launch.latest_value(logdir, 'replay_eval/items') > 0
    assert launch.latest_value(logdir, 'replay/workers') == 4
    assert launch.latest_value(logdir, 'replay_eval/workers') == 1
    ratio = launch.latest_value(logdir, 'limiter/train_ratio')
    assert 0.75 * 32 <= ratio <= 1.25 * 32, ratio
    assert launch.latest_value(logdir, 'train/train_batches') > 0
    assert launch.latest_value(logdir, 'report/reports') > 0
    # The runner's keys (limiter, servers, clients, usage, episodes) are on
    # docs/metrics.md.
    metrics_reference.check(metrics_reference.logged(logdir))


@pytest.mark.slow
def test_agent_process_and_grouped_envs(tmp_path):
    logdir = tmp_path / 'run'
    output = run_to_end(
        logdir, '--run.steps', '400', '--run.envs', '4',
        '--run.envs_per_worker', '2', '--run.eval_envs', '0',
        '--run.agent_process', 'True', '--run.actor_batch', '4',
        '--run.shared_batches', 'False')
    assert 'Reached run.steps (400)' in output
    assert summary(output)['shared_batches'] == 0  # All over the socket.
    assert launch.saved_tags(logdir, 'agent')[-1] >= 400
    assert launch.latest_value(logdir, 'train/train_batches') > 0


@pytest.mark.slow
def test_sigterm_saves_exits_and_resumes(tmp_path):
    logdir = tmp_path / 'run'
    flags = ('--run.envs', '2', '--run.eval_envs', '0',
             '--run.save_every', '1000')
    run = start(logdir, '--run.steps', '1e6', *flags, name='first')
    tree = Tree(run.proc)
    try:
        run.wait_for(
            lambda: tree.record() and progress_step(run.output()) >= 250,
            timeout=240, what='step 250')
        run.terminate(signal.SIGTERM)
        start_stop = time.monotonic()
        code, output = finish(run, tree, timeout=30)
        assert time.monotonic() - start_stop < 10, 'stop took too long'
    finally:
        run.kill()
    assert code == 0, output[-4000:]
    assert 'Traceback' not in output
    assert 'Received a stop signal' in output
    saved = launch.saved_tags(logdir, 'logger')[-1]
    assert saved >= 250
    assert launch.saved_tags(logdir, 'agent')[-1] == saved
    assert launch.saved_tags(logdir, 'replay')[-1] == saved

    output = run_to_end(
        logdir, '--run.steps', str(saved + 200), *flags, name='second')
    assert f'Logger resumed at step {saved}' in output
    assert f'Replay resumed from the save at step {saved}' in output
    assert launch.latest_value(logdir, 'train/loads') == 1
    assert launch.saved_tags(logdir, 'logger')[-1] >= saved + 200


@pytest.mark.slow
@pytest.mark.parametrize('module', [MODULE, 'original_main'])
def test_remote_envs_and_replay_started_as_separate_commands(tmp_path, module):
    """Each role as its own command; with `original_main`, every command
    gets exactly the original's `args` keys (the keys we add default)."""
    logdir = tmp_path / 'run'
    actor, replay, logger = launch_ports(3)
    # Long enough that the eval env command, which connects up to a second
    # after the train envs (back-off), steps before the run ends.
    flags = ('--run.steps', '2000', '--run.envs', '2', '--run.eval_envs', '1',
             '--run.envs_per_worker', '2',
             '--run.actor_addr', f'localhost:{actor}',
             '--run.replay_addr', f'localhost:{replay}',
             '--run.logger_addr', f'localhost:{logger}')
    run = functools.partial(start, logdir, module=module)
    runs = [
        run('--run.remote_envs', 'True', '--run.remote_replay', 'True',
            *flags, name='main'),
        run(*flags, script='parallel_replay', name='replay'),
        # The train envs in one command, the eval env (id 2) in another.
        run(*flags, '--run.eval_envs', '0', script='parallel_envs',
            name='envs'),
        run(*flags, '--replica', '2', script='parallel_env', name='eval_env'),
    ]
    outputs = finish_all(runs)
    assert 'Reached run.steps (2000)' in outputs[0]
    assert launch.latest_value(logdir, 'parallel_replay/eval_inserts') > 0
    assert launch.saved_tags(logdir, 'replay')[-1] >= 2000


@pytest.mark.slow
def test_actor_serves_original_one_env_requests_next_to_rows(tmp_path):
    """An env process of the original (one env per request, scalar envid,
    unbatched leaves) trains next to one of ours; the test agent checks
    both envs' steps arrive in order in the policy and the replay."""
    logdir = tmp_path / 'run'
    actor, = launch_ports(1)
    # Long enough that our env process, which starts slower than the
    # original's on a busy machine, steps too before the run ends.
    flags = ('--run.steps', '3000', '--run.envs', '2', '--run.eval_envs', '0',
             '--run.actor_batch', '1', '--run.actor_addr', f'localhost:{actor}',
             '--run.auth', 'False')  # The original's env has no secret.
    main = start(logdir, '--run.remote_envs', 'True', *flags, name='main')
    ours = start(logdir, *flags, '--replica', '0', script='parallel_env',
                 name='ours')
    original = launch.Launch(
        f'localhost:{actor}', 1, False, *COMMON, *flags,
        logfile=tmp_path / 'original.log',
        script=launch.SUPPORT / 'original_env.py')
    runs = (main, ours, original)
    outputs = finish_all(runs)
    assert 'Reached run.steps (3000)' in outputs[0]
    steps = re.findall(r'Original-style env 1 stepped (\d+) times', outputs[2])
    assert steps and int(steps[0]) >= 50, outputs[2][-2000:]
    # Both env processes inserted in one logging window (in the last one,
    # one of them may already have stopped).
    assert max(row.get('replay/workers', 0)
               for row in launch.metrics(logdir)) == 2


def test_actor_batch_larger_than_envs_is_rejected(tmp_path):
    logdir = tmp_path / 'run'
    result = launch.run(
        '--script', 'parallel', *COMMON, '--logdir', logdir,
        '--run.envs', '2', '--run.actor_batch', '3', module=MODULE,
        timeout=120)
    assert result.returncode == 2
    assert 'run.actor_batch = 3 is not allowed: expected at most run.envs ' \
        '(2)' in result.stdout


def launch_ports(count):
    from embodied.rpc import addresses
    return addresses.free_ports(count)


@pytest.mark.parametrize('taken', [1, 2])
def test_taken_auto_port_is_retried(monkeypatch, tmp_path, taken):
    """A port another program takes between choosing and binding makes the
    launch retry with fresh ports instead of failing."""
    from embodied.rpc import addresses
    from embodied.run.parallel import launcher

    calls = []
    fill_auto = addresses.fill_auto

    def flaky(addrs, ipv6=False, avoid=()):
        calls.append(addrs)
        return fill_auto(addrs, ipv6, avoid)

    class FakeLaunch:
        attempts = 0

        def __init__(self, factories, args, **kwargs):
            self.args = args

        def run(self):
            FakeLaunch.attempts += 1
            if FakeLaunch.attempts <= taken:
                from embodied import rpc
                raise rpc.WorkerFailed(
                    'Replay', rpc.supervisor.EXIT_PORT_TAKEN)
            return 'done'

    monkeypatch.setattr(launcher.rpc.addresses, 'fill_auto', flaky)
    monkeypatch.setattr(launcher.lifecycle, 'Launcher', FakeLaunch)
    import elements
    args = elements.Config(
        envs=2, actor_batch=-1, actor_addr='localhost:{auto}',
        replay_addr='localhost:{auto}', logger_addr='localhost:{auto}',
        logdir=str(tmp_path))
    result = launcher.combined(
        *[lambda *a: None] * 7, args)
    assert result == 'done'
    assert FakeLaunch.attempts == taken + 1
    assert len(calls) == taken + 1
