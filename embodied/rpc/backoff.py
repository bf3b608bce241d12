"""Waiting between reconnects: a growing delay and rate-limited reports.

Every path that reconnects to a server (env workers to the actor, clients of
the replay and the logger) waits through one `Backoff`, so a peer that is
refused or gone costs a few wake-ups a second at first and one every
`limit` seconds later, and its log gets one line per reason per `every`
seconds instead of one per attempt:

    backoff = Backoff(first=0.1, limit=5, every=30)
    while not try_connect():
        backoff.report('refused', 'Env00000: the actor refused ...')
        backoff.wait()              # 0.1, 0.2, 0.4, ... 5, 5, ... seconds
    backoff.reset()                 # connected: the next trouble starts over

Where no server listens yet, an attempt costs next to nothing, and a role
started before its server should not miss a short run: those waits pass
`cap=NO_SERVER_WAIT`.

`report` prints a reason's text when that reason was not printed within
`every` seconds, noting how often it happened in between.
"""

import time

# Longest wait between attempts that found no server: where a role waits for
# a server of its own launch (the actor, up once the policy compiled), this
# is how late it may notice it, and a refused connect costs next to nothing.
NO_SERVER_WAIT = 0.25


class Backoff:

    def __init__(self, first=0.1, limit=5.0, every=30.0, factor=2.0):
        assert 0 < first <= limit, (first, limit)
        self.first = first
        self.limit = limit
        self.every = every
        self.factor = factor
        self.delay = first
        self.attempts = 0          # Waits since the last reset.
        self.since = None          # When the trouble began (monotonic).
        self._printed = {}         # reason -> (time printed, count since)

    def next_delay(self, cap=None):
        """The delay `wait` sleeps next, at most `cap`; grows it for the
        one after."""
        if self.since is None:
            self.since = time.monotonic()
        delay = self.delay if cap is None else min(cap, self.delay)
        self.delay = min(self.limit, self.delay * self.factor)
        self.attempts += 1
        return delay

    def wait(self, stop=None, deadline=None, cap=None):
        """Sleeps the next delay (at most `cap`), less when `deadline`
        (monotonic) comes first; returns early with True when the `stop`
        event is set."""
        delay = self.next_delay(cap)
        if deadline is not None:
            delay = max(0.0, min(delay, deadline - time.monotonic()))
        if stop is not None:
            return stop.wait(delay)
        time.sleep(delay)
        return False

    def waited(self):
        """Seconds since the trouble began (0 when there is none)."""
        return 0.0 if self.since is None else time.monotonic() - self.since

    def reset(self):
        self.delay = self.first
        self.attempts = 0
        self.since = None

    def report(self, reason, text, again=None):
        """Prints `text` unless `reason` was printed within `every` seconds
        (`again` instead of `text` when it was printed before); returns
        whether it printed."""
        now = time.monotonic()
        last, count = self._printed.get(reason, (None, 0))
        if last is not None and now - last < self.every:
            self._printed[reason] = (last, count + 1)
            return False
        if last is not None and again:
            text = again
        if count:
            text += f' ({count} more times in the last {now - last:.0f} s)'
        self._printed[reason] = (now, 0)
        print(text, flush=True)
        return True

