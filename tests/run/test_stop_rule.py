"""The stop rule and the report loop that every runner shares."""

import threading
import time

import elements
import pytest

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
