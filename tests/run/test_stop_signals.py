"""SIGTERM to a run's whole process group, repeated as schedulers and
`timeout` do, stops the run after a final save with exit 0."""

import signal
import time

import pytest

import launch
from tests.run.parallel.test_parallel import COMMON, MODULE, Tree, finish, progress_step
from embodied.run import stopping


def test_repeated_sigterm_only_stops_but_second_sigint_aborts():
    previous = signal.getsignal(signal.SIGTERM)
    try:
        with stopping.StopSignal() as stop:
            signal.raise_signal(signal.SIGTERM)
            assert stop.requested
            for _ in range(3):
                signal.raise_signal(signal.SIGTERM)  # No KeyboardInterrupt.
            with pytest.raises(KeyboardInterrupt):
                signal.raise_signal(signal.SIGINT)
        # A late SIGTERM after the block cannot end the process either.
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous)


def terminate_group_twice(run):
    """What `timeout` does to a job in its own group: the group gets SIGTERM
    and the command gets it once more."""
    run.signal_group(signal.SIGTERM)
    time.sleep(0.05)
    run.signal_group(signal.SIGTERM)
    run.terminate(signal.SIGTERM)


def test_parallel_group_sigterm_twice_saves_and_exits_0(tmp_path):
    logdir = tmp_path / 'run'
    run = launch.Launch(
        '--script', 'parallel', *COMMON, '--logdir', logdir,
        '--run.envs', '2', '--run.eval_envs', '0', '--run.steps', '1e6',
        '--run.save_every', '1e6', logfile=tmp_path / 'run.log',
        module=MODULE, new_group=True)
    tree = Tree(run.proc)
    try:
        run.wait_for(
            lambda: tree.record() and progress_step(run.output()) >= 100,
            timeout=240, what='step 100')
        terminate_group_twice(run)
        code, output = finish(run, tree, timeout=60)
    finally:
        run.kill()
    assert code == 0, output[-4000:]
    assert 'Traceback' not in output, output[-4000:]
    assert 'Received a stop signal' in output
    saved = launch.saved_tags(logdir, 'logger')[-1]
    assert saved >= 100
    assert launch.saved_tags(logdir, 'agent')[-1] == saved
    assert launch.saved_tags(logdir, 'replay')[-1] == saved


def test_train_group_sigterm_twice_saves_and_exits_0(tmp_path):
    logdir = tmp_path / 'run'
    run = launch.Launch(
        '--script', 'train', '--configs', 'debug', '--agent_impl', 'testing',
        '--task', 'dummy_disc', '--run.log_every', '1', '--run.envs', '2',
        '--run.debug', 'False', '--run.steps', '1e9', '--run.save_every',
        '1e6', '--logdir', logdir, logfile=tmp_path / 'run.log',
        new_group=True)
    try:
        run.wait_for(
            lambda: (launch.latest_value(logdir, 'train/train_batches')
                     or 0) > 0, timeout=240, what='training to start')
        terminate_group_twice(run)
        code = run.wait(timeout=60)
    finally:
        run.kill()
    output = run.output()
    assert code == 0, output[-4000:]
    assert 'Traceback' not in output, output[-4000:]
    stopped = launch.saved_tags(logdir, 'logger')[-1]
    assert stopped > 0
    assert stopped in launch.saved_tags(logdir, 'agent')
    assert stopped in launch.saved_tags(logdir, 'replay')
