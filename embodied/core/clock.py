"""Time-based clocks that say when periodic work (log, report, save) is due."""

import time


class LocalClock:
    """True once every `every` seconds.

    `every == 0` never fires, `every < 0` always fires. The first call returns
    `first` and starts the period. `skip=True` answers False without touching
    the schedule, so a caller can postpone work it cannot do yet.
    """

    def __init__(self, every, first=False):
        self.every = every
        self.first = first
        self.prev = None

    def __call__(self, step=None, skip=None):
        if skip:
            return False
        if self.every == 0:
            return False
        if self.every < 0:
            return True
        now = time.monotonic()
        if self.prev is None:
            self.prev = now
            return self.first
        if now >= self.prev + self.every:
            self.prev = now
            return True
        return False


class GlobalClock(LocalClock):
    """The clock for decisions the whole run takes together (report, save).

    On one host it behaves like `LocalClock`; it exists as its own name so code
    says which decisions must agree between processes, as in the original.
    The parallel runner makes such decisions in one role and broadcasts them.
    """
