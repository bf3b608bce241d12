"""The learner's stream of batches from the replay process."""

import collections
import functools
import time

import elements

from embodied import rpc
from embodied.run import connections


RING_BYTES = 32 << 20
MAX_PER_REQUEST = 4  # With prefetch 4, at most 16 batches sampled ahead.


def batches_per_request(slot_bytes, prefetch):
    """How many batches of `slot_bytes` one request asks for: as many as
    keep the ring (`prefetch` requests in flight plus one held) within
    `RING_BYTES`, between 1 and `MAX_PER_REQUEST`. Small batches share a
    round trip; large ones do not fill /dev/shm."""
    fit = RING_BYTES // (slot_bytes * prefetch) - 1
    return max(1, min(MAX_PER_REQUEST, fit))


class RemoteStream:
    """Batches from the replay's `sample_batch_<source>`, requested
    `prefetch` ahead from the start. Ends (StopIteration) when `stop` is set
    or the replay shuts down. `count(key, amount=1)` adds to the learner's
    progress counters (`AgentLink.count`).

    With `shared`, once the first batch has shown the layout, batches come
    through a ring of shared-memory slots (`rpc.slots`) instead of the socket
    when the replay is on this machine, `per_request` batches a round trip
    (by default `batches_per_request` of the batch size)."""

    def __init__(self, args, source, stop, count, prefetch=4,
                 shared=False, per_request=None):
        self.source, self.stop, self.count = source, stop, count
        self.shared, self.prefetch = shared, prefetch
        self.asked_per_request = self.per_request = per_request
        self.ring = None
        self.client = connections.connect(
            args, 'replay', f'LearnerReplay{source.title()}')
        self.call = functools.partial(
            self.client.call, f'sample_batch_{source}')
        self.futures = collections.deque(
            self._request() for _ in range(prefetch))
        self.ready = collections.deque()  # Batches received, not yet used.
        self.received = 0
        self.report_every = args.wait_report
        self.addr = args.replay_addr

    def _report(self):
        return (f'Learner: waiting for a {self.source} batch from the replay '
                f'at {self.addr} ({self.received} received so far; the '
                f'replay reports its limiter and fill state while it waits)')

    def ready_soon(self):
        """Whether a batch has arrived (so `next` will not wait long)."""
        return (self.received > 0 or bool(self.ready) or
                self.futures[0][0].done())

    def __iter__(self):
        return self

    def __next__(self):
        if not self.ready:
            self._fetch()
        self.received += 1
        return self.ready.popleft()

    def _fetch(self):
        future, ring, slots = self.futures.popleft()
        start = time.monotonic()
        with elements.timer.section(f'stream_{self.source}_response'):
            data = rpc.result(
                future, self.stop,
                report_every=self.report_every, report=self._report)
        self.count(f'{self.source}_wait_seconds', time.monotonic() - start)
        if data is None:
            for slot in slots or ():
                ring.release(slot)
            raise StopIteration
        if slots is None:
            self.ready.append(data)
            if self.shared and self.ring is None:
                self._start_ring(data)
        else:
            for slot, reply in zip(slots, data):
                self.ready.append(self._receive(reply, ring, slot))
        # Asked after the slots of this reply are read, so that they count
        # as in use while the new request takes its slots.
        self.futures.append(self._request())

    def _request(self):
        ring = self.ring
        slots = []
        while ring and len(slots) < self.per_request:
            slot = ring.acquire()
            if slot is None:
                break
            slots.append(slot)
        if not slots:
            return self.call(), None, None
        return self.call(ring.target(slots)), ring, slots

    def _receive(self, reply, ring, slot):
        if rpc.slots.is_slot_reply(reply):
            assert int(reply) == slot, (int(reply), slot)
            ring.unlink()  # The replay has it mapped now.
            self.count(f'{self.source}_shared_batches')
            return ring.read(slot)
        ring.release(slot)
        if ring is self.ring:  # Not yet replaced after an earlier one.
            self._fall_back(reply)
        return reply

    def _start_ring(self, data):
        self.shared = False  # One try per layout.
        layout = rpc.slots.layout_of(data)
        self.per_request = self.asked_per_request or (batches_per_request(
            rpc.slots.slot_bytes(layout), self.prefetch) if layout else 1)
        # The batches in flight, and room for those received and held.
        slots = (self.per_request + 1) * self.prefetch
        self.ring, problem = rpc.slots.SlotRing.create(layout, slots)
        if problem:
            print(f'Learner: {self.source} batches come over the socket '
                  f'({problem}).', flush=True)

    def _fall_back(self, data):
        """The replay sent a batch instead of using the slot."""
        ring, self.ring = self.ring, None
        ring.close()
        if rpc.slots.layout_of(data) != ring.layout:
            self._start_ring(data)  # A ring for the new layout.
        else:
            print(f'Learner: {self.source} batches come over the socket (the '
                  f'replay at {self.addr} cannot open {ring.path}).',
                  flush=True)

    def close(self):
        if self.ring:
            self.ring.close()
        self.client.close(1)
