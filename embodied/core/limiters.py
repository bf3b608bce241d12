"""Rate limiting between the inserting and the sampling side of a replay.

The parallel runner's replay process owns one `SamplesPerInsert` limiter and
calls it from two kinds of threads::

    # add_batch (one call per env transition)
    limiters.wait(limiter.want_insert, 'Replay insert is waiting',
                  limiter.state, release=stopping)
    limiter.insert()
    replay.add(transition, worker=envid)

    # sample_batch_train (one call per sampled sequence)
    limiters.wait(limiter.want_sample, 'Replay sample is waiting',
                  limiter.state, release=stopping)
    limiter.sample()
    ...
    batch = replay.sample(batch_size, 'train')

`wait()` returns the seconds it waited, so callers can report the wait time,
count and fraction as metrics. `try_insert()` / `try_sample()` check and
record in one atomic step, for callers with several threads on one side.
"""

import math
import threading
import time

# How long `wait` sleeps between polls: it starts short so that a wait that is
# over quickly costs little latency, and backs off so a long wait does not
# spin a core.
_FIRST_SLEEP = 1e-4
_LONGEST_SLEEP = 5e-3
# With a `changed` condition the waker notifies, so polls are only a fallback.
_LONGEST_NOTIFIED_SLEEP = 5e-2


class Released(Exception):
    """Raised by `wait` when its `release` event is set (e.g. at shutdown)."""


def wait(predicate, message, info=None, report_every=30.0, release=None,
         changed=None):
    """Blocks until `predicate()` is true and returns the seconds waited.

    Polls with short sleeps that back off to a few milliseconds. Every
    `report_every` seconds it prints `message` with the time waited so far and
    `info` (a dict, or a callable returning one, such as a limiter's `state`).
    A `report_every` of None or 0 disables the reports. When the optional
    `release` event (a `threading.Event`) is set, the wait ends by raising
    `Released`, so a shutdown never hangs in a wait.

    With `changed` (a `threading.Condition` that the other side notifies after
    each step that may make `predicate` true, and that is notified when
    `release` is set), the wait sleeps on it instead: it wakes as soon as it
    is notified rather than at its next poll, and polls less often.
    """
    if predicate():
        return 0.0
    start = last_report = time.monotonic()
    # Notified waits wake when notified: their polls are a fallback only.
    sleep = _FIRST_SLEEP if changed is None else _LONGEST_NOTIFIED_SLEEP
    while True:
        if release is not None and release.is_set():
            waited = time.monotonic() - start
            raise Released(f'{message}: released after {waited:.1f}s')
        if predicate():
            return time.monotonic() - start
        now = time.monotonic()
        if report_every and now - last_report >= report_every:
            last_report = now
            print(_report(message, now - start, info), flush=True)
        if changed is not None:
            with changed:  # Checked under the lock, so no notify is missed.
                if not predicate() and not (release and release.is_set()):
                    changed.wait(sleep)
            sleep = min(2 * sleep, _LONGEST_NOTIFIED_SLEEP)
            continue
        if release is not None:
            release.wait(sleep)
        else:
            time.sleep(sleep)
        sleep = min(2 * sleep, _LONGEST_SLEEP)


def _report(message, waited, info):
    details = info() if callable(info) else info
    text = f'{message} (waited {waited:.1f}s'
    if details:
        text += ': ' + ', '.join(
            f'{k}={_number(v)}' for k, v in details.items())
    return text + ')'


def _number(value):
    if isinstance(value, float):
        return f'{value:.6g}'
    return str(value)


class SamplesPerInsert:
    """Keeps the number of samples per inserted item near a target ratio.

    Inserts are free until `minsize` items have been inserted. From then on,
    every insert (starting with the one that reaches `minsize`) credits
    `samples_per_insert` samples and every sample spends one. The balance of
    unspent credit, `avail`, is kept inside the window::

        -tolerance  <  avail  <  tolerance * samples_per_insert

    checked before each step: the sampler may run ahead of the inserts by about
    `tolerance` samples, the inserter ahead of the sampler by about `tolerance`
    inserts. `samples_per_insert <= 0` turns the limit off (only `minsize`
    holds), as in the original (whose runners read a negative `train_ratio`
    as no limit).

    Why these settings are the only ones that can deadlock: both sides are
    blocked only when `avail >= tolerance * spi` and `avail <= -tolerance` at
    once, which cannot happen when `tolerance > 0` and `spi > 0`, because each
    side checks the balance before its step rather than after it. A
    non-positive tolerance makes that window empty (both sides block at
    `avail = 0`); a non-finite value turns `avail` into inf or nan, where the
    comparisons stop making progress; `minsize < 1` would let a sampler start
    on an empty replay. `avail` is computed from integer counts rather than
    accumulated, so a tiny `samples_per_insert` cannot be lost to floating
    point rounding and starve the sampler.

    Thread-safe: every method takes the limiter's lock.
    """

    def __init__(self, samples_per_insert, tolerance, minsize):
        _check_settings(samples_per_insert, tolerance, minsize)
        self.samples_per_insert = float(samples_per_insert)
        self.tolerance = float(tolerance)
        self.minsize = int(minsize)
        self.min_avail = -self.tolerance
        self.max_avail = self.tolerance * self.samples_per_insert
        self._lock = threading.Lock()
        self._size = 0
        self._base = 0.0      # Balance carried over from a loaded state.
        self._credited = 0    # Inserts since the base that earned credit.
        self._sampled = 0     # Samples since the base.

    @property
    def size(self):
        """Number of inserts so far (including those from a loaded state)."""
        return self._size

    @property
    def avail(self):
        """Samples that may still be drawn at the target ratio (may be < 0)."""
        with self._lock:
            return self._avail()

    def _avail(self):
        return self._base + (
            self._credited * self.samples_per_insert - self._sampled)

    def want_insert(self, count=1):
        """Whether `count` inserts in a row would all be allowed now (always
        while under `minsize`). An inserter that waits for room for several
        goes on in fewer, larger steps; for this to never block both sides
        at once, `count - 1` must stay below `tolerance * (1 + 1 /
        samples_per_insert)`, e.g. at most `tolerance / 2`."""
        with self._lock:
            return self._want_insert(count)

    def want_sample(self):
        with self._lock:
            return self._want_sample()

    def insert(self, count=1):
        with self._lock:
            for _ in range(count):
                self._insert()

    def sample(self):
        with self._lock:
            self._sampled += 1

    def try_insert(self, count=1):
        """Records up to `count` inserts, each only if allowed when its turn
        comes, under one lock; returns how many it recorded."""
        with self._lock:
            taken = 0
            while taken < count and self._want_insert():
                self._insert()
                taken += 1
            return taken

    def try_sample(self, count=1):
        """Records up to `count` samples, each only if allowed when its turn
        comes, under one lock; returns how many it recorded."""
        with self._lock:
            taken = 0
            while taken < count and self._want_sample():
                self._sampled += 1
                taken += 1
            return taken

    def _want_insert(self, count=1):
        if self._size < self.minsize or self.samples_per_insert <= 0:
            return True
        room = self.max_avail - (count - 1) * self.samples_per_insert
        return self._avail() < room

    def _want_sample(self):
        if self._size < self.minsize:
            return False
        if self.samples_per_insert <= 0:
            return True
        return self._avail() > self.min_avail

    def _insert(self):
        self._size += 1
        if self._size >= self.minsize:
            self._credited += 1

    def state(self):
        """The numbers behind the limiter's decisions, for wait messages."""
        with self._lock:
            return {
                'size': self._size,
                'minsize': self.minsize,
                'avail': self._avail(),
                'min_avail': self.min_avail,
                'max_avail': self.max_avail,
                'samples_per_insert': self.samples_per_insert,
                'tolerance': self.tolerance,
            }

    def describe(self):
        """A one-line summary of `state()`."""
        s = self.state()
        return (
            f"SamplesPerInsert(size={s['size']}/{s['minsize']}, "
            f"avail={s['avail']:.3g} in ({s['min_avail']:.3g}, "
            f"{s['max_avail']:.3g}), "
            f"samples_per_insert={s['samples_per_insert']:.3g})")

    def save(self):
        with self._lock:
            return {'size': self._size, 'avail': self._avail()}

    def load(self, data):
        missing = {'size', 'avail'} - set(data)
        if missing:
            raise KeyError(
                f'SamplesPerInsert.load: saved state lacks {sorted(missing)} '
                f'(got keys {sorted(data)}).')
        with self._lock:
            self._size = int(data['size'])
            self._base = float(data['avail'])
            self._credited = 0
            self._sampled = 0


def _check_settings(samples_per_insert, tolerance, minsize):
    problems = []
    if not _is_number(samples_per_insert) or not math.isfinite(
            samples_per_insert):
        problems.append(
            f'samples_per_insert must be a finite number (<= 0 turns the '
            f'limit off), got {samples_per_insert!r}: a non-finite credit '
            f'per insert makes the balance meaningless.')
    if not _is_number(minsize) or minsize != int(minsize) or minsize < 1:
        problems.append(
            f'minsize must be an integer >= 1, got {minsize!r}: with nothing '
            f'inserted the sampler would start on an empty replay and wait '
            f'forever.')
    limited = _is_number(samples_per_insert) and samples_per_insert > 0
    if limited and (not _is_number(tolerance) or not math.isfinite(
            tolerance) or tolerance <= 0):
        problems.append(
            f'tolerance must be a finite number > 0, got {tolerance!r}: the '
            f'balance must stay in (-tolerance, tolerance * '
            f'samples_per_insert); with tolerance <= 0 that window is empty, '
            f'so once the sampler has spent its credit no insert is allowed '
            f'and no sample either (deadlock).')
    if problems:
        raise ValueError('SamplesPerInsert: ' + ' '.join(problems))


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) or (
        hasattr(value, 'dtype') and getattr(value, 'shape', None) == () and
        value.dtype.kind in 'iuf')
