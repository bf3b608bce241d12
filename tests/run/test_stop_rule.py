"""The stop rule and the report loop that every runner shares."""

import os
import subprocess
import sys
import textwrap
import threading
import time

import elements
import pytest

import launch

from embodied.run import reporting
from embodied.run import loop as looplib
from embodied.run import stopping


def args(steps=100, duration=0):
    return elements.Config(steps=steps, duration=duration)


def test_stop_reason_names_the_limit_reached():
    start = time.monotonic()
    assert stopping.stop_reason(args(), 99, start) is None
    assert stopping.stop_reason(args(), 100, start) == (
        'Reached run.steps (100)')
    assert stopping.stop_reason(args(duration=5), 0, start - 6) == (
        'Reached run.duration (5 s)')
    assert stopping.stop_reason(args(duration=5), 0, start) is None
    signal = stopping.StopSignal()
    assert stopping.stop_reason(args(), 0, start, signal) is None
    signal.event.set()
    assert stopping.stop_reason(args(), 100, start, signal) == (
        'Received a stop signal')  # A signal first: it is the cause.


def test_single_process_loop_stops_by_the_same_rule(capsys):
    logger = elements.Logger(elements.Counter(), [lambda summaries: None])
    loop = looplib.Loop(elements.Config(
        steps=10, duration=0, log_every=1, save_every=1,
        usage=dict(psutil=False)), logger)
    loop.begin('Start')
    signal = stopping.StopSignal()
    assert not loop.should_stop(signal)
    loop.step.increment(10)
    assert loop.should_stop(signal)
    assert 'Reached run.steps (10) at step 10.' in capsys.readouterr().out


class ReportAgent:
    """Counts report calls in its carry; records whether `lock` was held."""

    def __init__(self, lock=None):
        self.lock = lock
        self.held = []

    def report(self, carry, batch):
        self.held.append(self.lock.locked() if self.lock else None)
        return carry + 1, {'value': batch}


def report_args():
    return elements.Config(consec_report=2, report_batches=3)


def test_report_on_averages_consec_times_batches_and_returns_the_carry():
    agent = ReportAgent()
    carry, metrics = reporting.report_on(
        agent, iter(range(100)), report_args(), 0)
    assert carry == 6 and metrics == {'value': pytest.approx(2.5)}


def test_report_on_holds_the_lock_and_ends_with_the_stream():
    lock = threading.Lock()
    agent = ReportAgent(lock)
    carry, metrics = reporting.report_on(
        agent, iter(range(4)), report_args(), 0, lock)
    assert metrics is None and carry == 4  # The stream ended after 4.
    assert agent.held == [True] * 4


# Stops once its stdout loses its reader, during the block (noticed by a
# poll, without a write) or before it (noticed at its start).
WATCHING = textwrap.dedent('''
    import sys, time, types
    from embodied.core import broken_streams, linewise
    from embodied.run import stopping
    linewise.install()
    broken_streams.set_fallback(sys.argv[1])
    print('ready', flush=True)
    sys.stdin.readline()  # The pipe is closed by now.
    if sys.argv[2] == 'before':
        print('a line to nobody', flush=True)
    args = types.SimpleNamespace(steps=10, duration=0)
    with stopping.StopSignal(watch_output=True) as stop:
        deadline = time.monotonic() + 30
        while not stop.requested and time.monotonic() < deadline:
            time.sleep(0.05)
        print('reason:', stopping.stop_reason(args, 0, 0, stop), flush=True)
''')


@pytest.mark.parametrize('when', ['during', 'before'])
def test_a_stdout_that_lost_its_reader_is_a_stop_request(tmp_path, when):
    fallback = tmp_path / 'broken_pipe.log'
    read, write = os.pipe()
    with open(tmp_path / 'stderr', 'w') as errors:
        proc = subprocess.Popen(
            [sys.executable, '-c', WATCHING, str(fallback), when],
            stdin=subprocess.PIPE, stdout=write, stderr=errors, text=True,
            env=launch.env())
    os.close(write)
    with os.fdopen(read) as pipe:
        assert pipe.readline() == 'ready\n'
    proc.communicate('go\n', timeout=60)
    assert proc.returncode == 0
    why = 'broken pipe' if when == 'before' else 'pipe closed by its reader'
    assert f'reason: Stdout lost its reader ({why})' in fallback.read_text()
    # The stream still working says why, and where the output goes.
    assert (tmp_path / 'stderr').read_text() == (
        f"This command's stdout lost its reader ({why}): stopping after the "
        f"current step and saving; its output goes on in {fallback}.\n")
