"""Actor -> replay: the actor's writer of transitions to the replay, which
joins its sends while the replay is busy and holds the actor back
(back-pressure) once too much is held or in flight.

    sender = CoalescingSender(send, join, size, hold, backlog)
    sender.put(item)        # goes on at once, or is held (see below)
    sender.flush()          # sends what is held; True when nothing is
    sender.settle()         # True once every send has arrived

`send(item)` makes the calls of one item and returns their futures; the
first is the pacing peer's. While that peer has not answered the last send,
further items are held, and go on together when it answers (at the next
`put` or `flush(force=False)`), `join(held)` making one item of them (or
several, should they not join; one held item as it is; `concat_rows` joins
rows of dicts of arrays): a busy peer gets fewer, larger requests, an idle
one every item at once. Once `hold` units (`size(item)` each) are held,
`put` waits for the peer's answer, and with it its caller: at most one
send is on its way to a busy peer. At most `backlog` sends are in flight,
as a client's `maxinflight` would allow, but a wait gives up with an error
once `closing` is set (a call blocked on a dead peer would keep its process
from exiting). `put` runs one at a time (the caller's order); `flush` and
`settle` may run on other threads and never wait.

The other direction, replay -> learner, is `replay_to_learner`.
"""

import collections
import threading

import numpy as np


class CoalescingSender:
    """Joins sends while the peer is busy; see the module docstring."""

    def __init__(self, send, join, size, hold, backlog, closing=None,
                 name='The sender'):
        self.send, self.join, self.size = send, join, size
        self.name = name  # For errors: '<name> shut down with ...'.
        self.hold, self.backlog = hold, backlog
        self.outbox = []
        self.outbox_size = 0
        self.outbox_lock = threading.Lock()  # Guards the outbox and sends.
        self.last_send = None  # The pacing peer's future of the last send.
        self.inflight = collections.deque()  # Futures of sent items.
        self.inflight_lock = threading.Lock()  # Guards `inflight`.
        # Set at shutdown: a send waiting for room gives up.
        self.closing = closing or threading.Event()

    def put(self, item):
        """Sends `item`, or holds it while the peer has not answered the
        last send."""
        with self.outbox_lock:
            self.outbox.append(item)
            self.outbox_size += self.size(item)
            if self._busy():
                if self.outbox_size < self.hold:
                    return
                # One send at a time to a busy peer: rather than piling up
                # items, the caller waits.
                self._wait_for_peer()
            self._send_outbox()
        self.settle()

    def flush(self, force=True):
        """Sends held items (with `force=False`, only once the peer has
        answered the last send); returns whether none is held. Never waits:
        while a send is under way, or `backlog` sends are in flight (a peer
        that does not answer), they stay held."""
        if not self.outbox_lock.acquire(blocking=False):
            return False  # `put` is sending (or waits for room).
        try:
            if self.outbox and (force or not self._busy()):
                with self.inflight_lock:  # Arrived ones count as gone.
                    room = sum(not f.done() for f in self.inflight) < (
                        self.backlog)
                if room:
                    self._send_outbox()
            return not self.outbox
        finally:
            self.outbox_lock.release()

    def settle(self):
        """Forgets sends that arrived; True when none is left. Raises what a
        peer raised."""
        with self.inflight_lock:
            while self.inflight and self.inflight[0].done():
                self.inflight.popleft().result()
            return not self.inflight

    def _busy(self):
        return self.last_send is not None and not self.last_send.done()

    def _send_outbox(self):
        held, self.outbox, self.outbox_size = self.outbox, [], 0
        self._wait_for_room()
        for item in self.join(held):
            futures = self.send(item)
            self.last_send = futures[0]
            with self.inflight_lock:
                self.inflight.extend(futures)

    def _wait_for_peer(self):
        """Waits until the peer answered the last send; gives up at
        shutdown, as `_wait_for_room`."""
        while self._busy():
            if self.closing.is_set():
                raise RuntimeError(f'{self.name} shut down with items still '
                                   f'waiting for the peer to answer.')
            self.last_send.wait(0.1)

    def _wait_for_room(self):
        """Back-pressure: waits while `backlog` sends are in flight."""
        while True:
            with self.inflight_lock:
                full = len(self.inflight) >= self.backlog
                oldest = self.inflight[0] if full else None
            if oldest is None:
                return
            if self.closing.is_set():
                raise RuntimeError(
                    f'{self.name} shut down with sends still in flight.')
            oldest.wait(0.1)
            self.settle()


def concat_rows(held):
    """A `join` for `CoalescingSender`: held items, each a tuple of dicts of
    arrays, as one item with the rows of each dict concatenated in order;
    as they are should their keys differ (a server takes batched requests
    of one set of keys only)."""
    first = held[0]
    if len(held) == 1 or any(
            len(item) != len(first) or any(
                part.keys() != ref.keys() for part, ref in zip(item, first))
            for item in held):
        return held
    return [tuple(
        {key: np.concatenate([item[i][key] for item in held])
         for key in first[i]} for i in range(len(first)))]
