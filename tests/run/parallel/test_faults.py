"""Fault injection into the parallel runner, end to end on the command line.

Each test runs the real launch with the test agent (which fails the run on
out-of-order data) and checks what survives, what ends the run and with which
message, and that no process of the launch is left behind. The dummy env fails
on demand through `--env.dummy.fail_after N --env.dummy.fail_mode MODE`.
"""

import os
import random
import re
import shutil
import signal
import socket
import time

import elements
import pytest

import launch
from embodied import rpc
from embodied.rpc import auth
from tests.run.parallel.test_parallel import (
    COMMON, MODULE, Tree, finish, progress_step, run_to_end, start)

FAST = ('--run.envs', '2', '--run.eval_envs', '0')


def run_failing(logdir, *flags, timeout=120, name='run', workers=True):
    """Runs a launch that must fail; returns its output."""
    run = start(logdir, *flags, name=name)
    tree = Tree(run.proc)
    try:
        code, output = finish(run, tree, timeout)
    finally:
        run.kill()
    assert code != 0, output[-3000:]
    if workers:
        assert tree.seen, 'the launch started no processes'
    return output


def wait_step(run, tree, step, timeout=120):
    run.wait_for(
        lambda: tree.record() and progress_step(run.output()) >= step,
        timeout=timeout, what=f'step {step}')


def wait_first_step(run, tree):
    run.wait_for(lambda: tree.record() and 'First env step' in run.output(),
                 what='the first env step')


def worker_pid(output, name):
    match = re.search(rf'{name} \(pid (\d+)\)', output)
    assert match, f'no pid of {name} in:\n{output[-2000:]}'
    return int(match.group(1))


def metric_total(logdir, key):
    return sum(row.get(key, 0) for row in launch.metrics(logdir))


def common_tag(logdir):
    tags = [set(launch.saved_tags(logdir, r))
            for r in ('agent', 'replay', 'logger')]
    common = tags[0] & tags[1] & tags[2]
    return max(common) if common else None


# Env workers that die are restarted.


@pytest.mark.slow
def test_sigkilled_env_is_restarted_and_run_reaches_steps(tmp_path):
    logdir = tmp_path / 'run'

    def kill_env(run, tree):
        # Once the logger counted 100 steps it holds the killed env's open
        # episode (right after the first env step it may not have seen one
        # of that env yet, and has none to abandon).
        wait_step(run, tree, 100)
        os.kill(worker_pid(run.output(), 'Env00001'), signal.SIGKILL)

    # Episodes longer than the run: the killed env's episode is unfinished.
    output = run_to_end(
        logdir, *FAST, '--run.steps', '1500', '--env.dummy.length', '2000',
        during=kill_env)
    assert 'Reached run.steps (1500)' in output
    assert "Worker 'Env00001' ended unexpectedly (killed by SIGKILL" in output
    assert 'Restarted Env00001' in output
    assert 'env_restarts=1' in output
    assert metric_total(logdir, 'parallel/env_crashes') == 1
    assert metric_total(logdir, 'parallel/ep_abandoned') == 1


def test_segfaulting_envs_are_restarted(tmp_path):
    output = run_to_end(
        tmp_path / 'run', *FAST, '--run.steps', '250',
        '--env.dummy.fail_after', '60', '--env.dummy.fail_mode', 'segfault')
    assert 'Reached run.steps (250)' in output
    assert 'killed by SIGSEGV' in output
    assert 'Restarted Env0000' in output


def test_env_that_keeps_failing_ends_run_after_bounded_restarts(tmp_path):
    logdir = tmp_path / 'run'
    output = run_failing(
        logdir, *FAST, '--run.steps', '1e6', '--run.env_restarts', '1',
        '--env.dummy.fail_after', '30')
    assert 'restart 1 of 1 (run.env_restarts)' in output
    assert 'more than run.env_restarts (1) allows' in output
    assert 'RuntimeError: Dummy: failing at step 30' in output
    assert 'Saved checkpoints at step' in output  # The other roles saved.
    assert common_tag(logdir) is not None
    assert 'All workers exited.' in output


# Bad input ends the run with a clear message, after a save.


@pytest.mark.slow
@pytest.mark.parametrize('mode, key, problem, per_worker', [
    ('dtype', 'image', 'wrong dtype', 1),
    ('shape', 'image', 'wrong shape', 1),
    ('nan', 'vector', 'not finite', 1),
    ('keys', 'vector', 'missing', 1),
    # Two envs per worker: their obs are checked stacked, then one by one.
    ('shape', 'image', 'wrong shape', 2),
    ('nan', 'vector', 'not finite', 2),
])
def test_bad_observation_ends_run_naming_env_and_key(
        tmp_path, mode, key, problem, per_worker):
    logdir = tmp_path / 'run'
    output = run_failing(
        logdir, *FAST, '--run.steps', '1e6',
        '--run.envs_per_worker', str(per_worker),
        '--env.dummy.fail_after', '40', '--env.dummy.fail_mode', mode)
    message = re.search(
        rf"bad input, exit code 65\): BadInput: Env (\d): obs '{key}': "
        rf"{problem}: expected Space\(.*\), got .*", output)
    assert message, output[-3000:]
    assert 'Restarted' not in output
    assert 'Saved checkpoints at step' in output
    assert common_tag(logdir) is not None


def test_env_failing_in_constructor_ends_run(tmp_path):
    # The command line builds one env for its spaces before any worker.
    output = run_failing(
        tmp_path / 'run', *FAST, '--env.dummy.fail_after', '1',
        '--env.dummy.fail_mode', 'init', workers=False)
    assert 'failing in the constructor as asked' in output


def _failing_env(envid):
    raise RuntimeError(f'no env {envid} today')


def _exit_with(code):
    return code


def test_env_worker_constructor_error_is_not_restarted():
    from embodied import rpc
    from embodied.run import arguments
    from embodied.run.parallel import env as env_workers

    args = arguments.with_defaults(elements.Config(
        actor_addr='localhost:1', logger_addr='localhost:{auto}',
        log_every=1, connect_timeout=1))
    with pytest.raises(env_workers.EnvInitError, match='Env 3 failed in its '
                       'constructor: RuntimeError: no env 3 today') as e:
        env_workers.run_worker(_failing_env, [3], args, False)
    assert e.value.exitcode == rpc.supervisor.EXIT_ENV_INIT

    spec = env_workers.EnvWorkerSpec('Env00003', [3], False, lambda: rpc.Process(
        _exit_with, rpc.supervisor.EXIT_ENV_INIT, name='Env00003'))
    pool = env_workers.pool([spec], args.update(env_restarts=5))
    pool.start()
    try:
        with pytest.raises(rpc.WorkerFailed, match='failed in the constructor'):
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                pool.poll()
                time.sleep(0.05)
        assert pool.restarts == 0
    finally:
        pool.kill()


# Other roles that die end the run; the survivors save first.


def test_sigkilled_replay_ends_run_and_survivors_save(tmp_path):
    logdir = tmp_path / 'run'
    run = start(logdir, *FAST, '--run.steps', '1e6')
    tree = Tree(run.proc)
    try:
        wait_step(run, tree, 100)
        os.kill(worker_pid(run.output(), 'Replay'), signal.SIGKILL)
        code, output = finish(run, tree, 60)
    finally:
        run.kill()
    assert code != 0
    assert ("Ending the run: Worker 'Replay' ended unexpectedly (killed by "
            "SIGKILL, exit code -9)") in output
    saved = re.search(r'Saving what is left at step (\d+): agent, logger',
                      output)
    assert saved, output[-3000:]
    step = int(saved.group(1))
    assert launch.saved_tags(logdir, 'agent')[-1] == step
    assert launch.saved_tags(logdir, 'logger')[-1] == step


# SIGKILL of the whole tree, then the same command again.


def saves_started(output):
    return output.count('Saving checkpoint:')


@pytest.mark.slow
@pytest.mark.parametrize('moment', ['start', 'running', 'saving'])
def test_sigkill_of_whole_tree_then_resume(tmp_path, moment):
    logdir = tmp_path / 'run'
    flags = (*FAST, '--run.save_every', '1')
    run = start(logdir, '--run.steps', '1e6', *flags, name='first')
    tree = Tree(run.proc)
    try:
        if moment == 'start':
            run.wait_for(lambda: tree.record() and 'Workers:' in run.output(),
                         what='workers started')
        elif moment == 'running':
            wait_step(run, tree, 200)
        else:
            wait_step(run, tree, 100)
            before = saves_started(run.output())
            run.wait_for(lambda: saves_started(run.output()) > before,
                         timeout=60, what='a save')
        tree.record()
        rpc.workers.kill_tree(run.proc.pid)
        run.wait(10)
    finally:
        run.kill()
    assert not tree.left(), 'processes survived the SIGKILL'
    saved = common_tag(logdir)
    if moment != 'start':
        assert saved is not None
    if moment == 'saving':
        # The save the SIGKILL hit may have completed; leave on disk what a
        # kill mid-save leaves: a newer save that reached two of the three
        # roles, and a replay save still in its temporary folder.
        ckpt = logdir / 'ckpt'
        name, newer = f'{saved:012d}', f'{saved + 7:012d}'
        for role in ('agent', 'logger'):
            shutil.copytree(ckpt / role / name, ckpt / role / newer)
        partial = ckpt / 'replay' / f'.tmp-{newer}-0badf00d'
        shutil.copytree(ckpt / 'replay' / name, partial)
        (partial / 'done').unlink()
        assert common_tag(logdir) == saved
    replay_items = None
    if saved is not None:
        replay_items = len(list((logdir / 'replay').glob('*.npz')))

    target = (saved or 0) + 150
    output = run_to_end(logdir, '--run.steps', str(target), *flags,
                    name='second')
    assert f'Reached run.steps ({target})' in output
    assert 'Traceback' not in output
    if saved is not None:
        assert f'Logger resumed at step {saved}' in output
        assert f'Learner resumed the agent from the save at step {saved}' in (
            output)
        resumed = re.search(
            rf'Replay resumed from the save at step {saved} \((\d+) items\)',
            output)
        assert resumed and int(resumed.group(1)) > 0, output[-3000:]
        assert replay_items
        assert launch.latest_value(logdir, 'train/loads') == 1
    assert common_tag(logdir) >= target


# Garbage on the ports the run opens.


def test_garbage_to_every_port_is_dropped_and_run_continues(tmp_path):
    logdir = tmp_path / 'run'
    rng = random.Random(0)
    payloads = [
        bytes(rng.randrange(256) for _ in range(64)),         # bad handshake
        b'portal_handshake' + (0).to_bytes(8, 'little'),      # zero-length
        b'portal_handshake' + (2 ** 62).to_bytes(8, 'little'),  # too long
        b'portal_handshake' + (20).to_bytes(8, 'little') + b'\xff' * 20,
    ]

    def attack(run, tree):
        wait_first_step(run, tree)
        for port in launch.launch_ports(run.output()):
            socket.create_connection(('127.0.0.1', port), 5).close()
            for payload in payloads:
                with socket.create_connection(('127.0.0.1', port), 5) as sock:
                    sock.sendall(payload)
                    sock.settimeout(5)
                    told = b''
                    try:
                        while chunk := sock.recv(4096):
                            told += chunk
                    except ConnectionResetError:
                        pass
                    # The server hung up, after telling a peer whose bad
                    # handshake began as portal's that it was refused.
                    assert not told or auth.parse_verdict(told[8:])[0] is False

    output = run_to_end(logdir, *FAST, '--run.steps', '1500', during=attack)
    assert 'Reached run.steps (1500)' in output
    assert launch.saved_tags(logdir, 'agent')[-1] >= 1500


# Refused before anything starts.


def run_refused(tmp_path, *flags):
    return launch.run(
        '--script', 'parallel', *COMMON, '--logdir', tmp_path / 'run',
        *flags, module=MODULE, timeout=120)


def test_oversized_replay_is_refused_before_allocating(tmp_path):
    result = run_refused(tmp_path, '--replay.size', '1e13')
    assert result.returncode == 2
    assert 'The replay cannot fit in memory' in result.stdout
    assert '--replay.size' in result.stdout
    assert not (tmp_path / 'run').exists()


def test_unknown_flag_names_closest_key(tmp_path):
    result = run_refused(tmp_path, '--run.env_restart', '3')
    assert result.returncode == 2
    assert "Unknown flag '--run.env_restart'" in result.stdout
    assert "'run.env_restarts'" in result.stdout


def test_missing_from_checkpoint_is_named(tmp_path):
    missing = tmp_path / 'nothing'
    result = run_refused(tmp_path, '--run.from_checkpoint', missing)
    assert result.returncode != 0
    assert f'run.from_checkpoint: No complete checkpoint at {missing}' in (
        result.stdout)


def test_unreachable_remote_replay_ends_run_naming_address(tmp_path):
    from embodied.rpc import addresses
    port, = addresses.free_ports(1)
    output = run_failing(
        tmp_path / 'run', *FAST, '--run.remote_replay', 'True',
        '--run.replay_addr', f'localhost:{port}',
        '--run.connect_timeout', '3', '--run.wait_report', '1')
    # Whoever waited for the replay the full 3 s first ends the run, the
    # launcher or one of the agent's clients; both name the address and
    # reported while waiting. Local roles (the logger) have no time limit,
    # so a busy machine that starts them slowly changes nothing.
    port = re.escape(str(port))
    assert re.search(
        rf'The replay at localhost:{port} did not come up within 3 s|'
        rf'no server at localhost:{port} after 3 s', output), output[-3000:]
    assert re.search(
        rf'waiting for the (replay|server) at localhost:{port}', output)


def test_from_checkpoint_that_does_not_match_the_agent_is_named(tmp_path):
    from embodied.core import checkpoint as cplib
    folder = tmp_path / 'other' / '000000000001'
    cplib.write(folder, {'agent': lambda: {
        'counters': {'weights_of_another_agent': 1}}})
    output = run_failing(
        tmp_path / 'run', *FAST, '--run.from_checkpoint', folder)
    assert f'run.from_checkpoint {folder} does not match the agent: ' in output
    assert 'weights_of_another_agent' in output
    assert "Ending the run: Worker 'Agent' ended unexpectedly" in output


def test_remote_envs_that_never_connect_end_run(tmp_path):
    output = run_failing(
        tmp_path / 'run', *FAST, '--run.remote_envs', 'True',
        '--run.connect_timeout', '3')
    assert re.search(r'No env worker reached the actor at localhost:\d+ '
                     r'within 3 s \(run.connect_timeout\)', output), (
        output[-3000:])


def test_space_errors_are_told_apart_from_env_errors():
    import elements
    import numpy as np
    from embodied.core import wrappers
    from embodied.envs import dummy

    spaces = {'action': elements.Space(np.int32, (), 0, 4)}
    with pytest.raises(wrappers.SpaceError,
                       match="action 'action': out of bounds"):
        wrappers.check_values('action', {'action': np.int32(9)}, spaces)

    class Failing(dummy.Dummy):
        def step(self, action):
            raise ValueError('the env itself failed')

    env = wrappers.CheckSpaces(Failing('disc'))
    with pytest.raises(ValueError, match='the env itself') as error:
        env.step({'action': np.int32(1), 'reset': np.bool_(True)})
    assert not isinstance(error.value, wrappers.SpaceError)
    with pytest.raises(wrappers.SpaceError, match="action 'action'"):
        env.step({'action': np.int32(7), 'reset': np.bool_(False)})
