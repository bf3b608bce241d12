"""Time-based clocks that say when periodic work (log, report, save) is due.

`LocalClock` decides on its own. `GlobalClock` is for decisions every replica
of a multi-replica run must take together: after `setup(...)` with more than
one replica, replica 0 serves the decisions and every replica (replica 0
too) asks it, so all get the same answer for their n-th call of a clock.
Without `setup` (or with one replica) a `GlobalClock` is a `LocalClock`.
The server and the replicas' connections to it live above core, with the
runners (`run/clock_server.py`), which install them here (`connect_with`):
core imports neither the RPC layer nor the runners.
"""

import threading
import time

# Set by `setup` (or `use`) for a multi-replica run: where decisions come from.
_LINK = None
# How `setup` connects the replicas; see `connect_with`.
_CONNECT = None


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
    """A clock whose decisions agree across the replicas of a run.

    After `setup` with `replicas > 1`, every replica must create its global
    clocks in the same order and call each clock equally often: the n-th
    call of a clock waits for the n-th call of every replica, and all get one
    decision, with `LocalClock`'s rules on replica 0's time. It is False when
    any replica skips. Otherwise it behaves like `LocalClock`.
    """

    def __init__(self, every, first=False):
        super().__init__(every, first)
        self.link = _LINK
        if self.link:
            self.clockid = self.link.create(float(every), bool(first))

    def __call__(self, step=None, skip=None):
        if not self.link:
            return super().__call__(step, skip)
        return bool(self.link.should(self.clockid, bool(skip)))


def use(link):
    """Makes global clocks created from now on take their decisions from
    `link` (an object with `create(every, first) -> clockid` and
    `should(clockid, skip) -> bool`, e.g. `embodied.jax.distributed.
    ClockLink` over JAX's key-value store); None makes them local again."""
    global _LINK
    _LINK = link


def connect_with(connect):
    """Installs how `setup` connects a replica: `connect(is_server,
    replica, replicas, port, addr, timeout)` returns a link for `use`
    whose `close()` disconnects (and stops the server it started).
    The runners' package installs its `clock_server.connect`."""
    global _CONNECT
    _CONNECT = connect


def setup(is_server, replica, replicas, port, addr, timeout=600):
    """Connects this replica to the clock server of a multi-replica run.

    `is_server`: this replica serves the decisions (exactly one does) on
    `port`, a port number (bound on loopback) or `'host:port'` naming the
    interface to bind (e.g. `'0.0.0.0:7000'` for other machines). `addr`:
    `'host:port'` of that server for every replica. A replica that waits
    longer than `timeout` seconds for the others gets a TimeoutError naming
    the missing replicas. Does nothing for `replicas <= 1`.
    """
    global _LINK
    if _LINK is not None:
        raise RuntimeError('embodied.clock.setup() was already called.')
    replicas, replica = int(replicas), int(replica)
    if replicas <= 1:
        return
    if not 0 <= replica < replicas:
        raise ValueError(
            f'clock setup: replica {replica} is not in [0, {replicas}).')
    if _CONNECT is None:
        raise RuntimeError(
            'embodied.clock.setup() connects replicas through the runners '
            '(run/clock_server.py), installed when embodied is imported.')
    _LINK = _CONNECT(is_server, replica, replicas, port, addr, timeout)


def close():
    """Disconnects from the clock server (and stops it on its replica);
    clocks created afterwards are local again."""
    global _LINK
    if _LINK and hasattr(_LINK, 'close'):
        _LINK.close()
    _LINK = None


class Decider:
    """The clock server's state: one decision per round of calls.

    Round n of a clock is the n-th call of it by each replica; its decision
    is made when the last replica arrives and is given to all of them.
    Thread-safe; `should` blocks until the round is complete.
    """

    def __init__(self, replicas, timeout=600):
        self.replicas = replicas
        self.timeout = timeout
        self.clocks = []           # clockid -> LocalClock on this host
        self.created = [0] * replicas  # replica -> clocks it has created
        self.calls = {}            # (replica, clockid) -> calls made
        self.rounds = {}           # (clockid, n) -> {replica: skip}
        self.decisions = {}        # (clockid, n) -> [decision, replicas left]
        self.cond = threading.Condition()

    def create(self, replica, every, first):
        """Registers the replica's next clock; returns its clockid."""
        replica, every, first = int(replica), float(every), bool(first)
        with self.cond:
            clockid = self.created[replica]
            self.created[replica] += 1
            if clockid == len(self.clocks):
                self.clocks.append(LocalClock(every, first))
            clock = self.clocks[clockid]
            if (clock.every, clock.first) != (every, first):
                raise ValueError(
                    f'GlobalClock {clockid}: replica {replica} created it '
                    f'with every={every}, first={first}, but another '
                    f'replica with every={clock.every}, '
                    f'first={clock.first}; every replica must create the '
                    f'same clocks in the same order.')
            return clockid

    def should(self, replica, clockid, skip):
        """The decision of the replica's next call of clock `clockid`."""
        replica, clockid, skip = int(replica), int(clockid), bool(skip)
        with self.cond:
            if not 0 <= clockid < len(self.clocks):
                raise ValueError(
                    f'GlobalClock {clockid} of replica {replica} was never '
                    f'created on the clock server.')
            n = self.calls.get((replica, clockid), 0)
            self.calls[replica, clockid] = n + 1
            key = (clockid, n)
            arrived = self.rounds.setdefault(key, {})
            arrived[replica] = skip
            if len(arrived) == self.replicas:
                del self.rounds[key]
                skipped = any(arrived.values())
                decision = self.clocks[clockid](skip=skipped)
                self.decisions[key] = [decision, self.replicas]
                self.cond.notify_all()
            deadline = time.monotonic() + self.timeout
            while key not in self.decisions:
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sorted(
                        set(range(self.replicas)) - set(arrived))
                    raise TimeoutError(
                        f'GlobalClock {clockid}, call {n}: replicas '
                        f'{missing} did not call within {self.timeout} s.')
                self.cond.wait(left)
            entry = self.decisions[key]
            entry[1] -= 1
            if not entry[1]:
                del self.decisions[key]
            return entry[0]
