import time

import pytest

import embodied


def wait_until(condition, timeout=5):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError('condition not met in time')
        time.sleep(0.001)


@pytest.mark.parametrize('clock_type', [
    embodied.LocalClock, embodied.GlobalClock])
class TestClock:

    def test_zero_never(self, clock_type):
        clock = clock_type(0, first=True)
        assert not any(clock() for _ in range(10))

    def test_negative_always(self, clock_type):
        clock = clock_type(-1)
        assert all(clock() for _ in range(10))

    def test_first(self, clock_type):
        assert clock_type(100, first=True)() is True
        assert clock_type(100, first=False)() is False

    def test_fires_once_per_period(self, clock_type):
        clock = clock_type(0.05)
        assert not clock()  # Starts the period.
        assert not clock()
        start = time.monotonic()
        wait_until(clock)
        assert time.monotonic() - start >= 0.04
        assert not clock()  # A new period began when it fired.

    def test_skip_leaves_schedule(self, clock_type):
        clock = clock_type(0.05, first=True)
        assert clock(skip=True) is False  # Does not count as the first call.
        assert clock() is True
        assert not clock()
        wait_until(lambda: time.monotonic() >= clock.prev + clock.every)
        assert clock(skip=True) is False
        assert clock() is True  # The skipped firing is still due.
        assert clock(skip=True) is False
        assert not clock()

    def test_skip_with_special_periods(self, clock_type):
        assert clock_type(-1)(skip=True) is False
        assert clock_type(0)(skip=True) is False
