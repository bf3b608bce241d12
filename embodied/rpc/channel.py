"""The batch channel: batches from a producer to a consumer through
shared-memory slots where both are on one machine, else over the socket.

    # Consumer (the learner's stream of one replay method):
    consumer = Consumer(functools.partial(client.call, 'sample_batch_train'),
                        'Learner: train batches', shared=True, prefetch=4)
    pending = consumer.request()               # a call, naming free slots
    batches = consumer.receive(pending, rpc.result(pending.future))
    # None: the producer has nothing more (it shut down)

    # Producer (the replay's method), one reply per slot named:
    producer = Producer()
    def sample_batch_train(target=None):
        return producer.answer(target, make, layout, make_into)

The consumer asks plainly until the first batch shows the layout; then it
keeps a ring of slots (`slots.SlotRing`, `per_request` batches a round trip)
and names free ones in each request. The producer makes each batch in the
slot where it can (`make_into(views)`, given `layout()`), else makes it and
copies it there, and replies with the slot number. Where a slot cannot take
the batch (another machine, a layout that changed, no /dev/shm or too
little room there) the batch itself comes back, and the consumer makes a
ring for the new layout or stays on the socket, with a line saying why.
"""

import collections

from . import slots

RING_BYTES = 32 << 20
MAX_PER_REQUEST = 4  # With prefetch 4, at most 16 batches sampled ahead.

Pending = collections.namedtuple('Pending', 'future ring slots')


def batches_per_request(slot_bytes, prefetch):
    """How many batches of `slot_bytes` one request asks for: as many as
    keep the ring (`prefetch` requests in flight plus one held) within
    `RING_BYTES`, between 1 and `MAX_PER_REQUEST`. Small batches share a
    round trip; large ones do not fill /dev/shm."""
    fit = RING_BYTES // (slot_bytes * prefetch) - 1
    return max(1, min(MAX_PER_REQUEST, fit))


class Consumer:
    """The consumer's side: `call(target=None)` asks the producer; `name`
    opens the lines it prints; `on_shared()` is called per batch that came
    through a slot. With `shared` False, batches always come over the
    socket."""

    def __init__(self, call, name, shared, prefetch, per_request=None,
                 on_shared=None, peer=''):
        self.call, self.name, self.peer = call, name, peer
        self.shared, self.prefetch = shared, prefetch
        self.asked_per_request = self.per_request = per_request
        self.on_shared = on_shared or (lambda: None)
        self.ring = None

    def request(self):
        """Calls the producer, naming up to `per_request` free slots."""
        ring = self.ring
        taken = []
        while ring and len(taken) < self.per_request:
            slot = ring.acquire()
            if slot is None:
                break
            taken.append(slot)
        if not taken:
            return Pending(self.call(), None, None)
        return Pending(self.call(ring.target(taken)), ring, taken)

    def receive(self, pending, data):
        """The batches of a request's reply `data`; None when the producer
        answered None (it has no more), with the slots freed."""
        if data is None:
            for slot in pending.slots or ():
                pending.ring.release(slot)
            return None
        if pending.slots is None:
            if self.shared and self.ring is None:
                self._start_ring(data)
            return [data]
        return [self._receive(reply, pending.ring, slot)
                for slot, reply in zip(pending.slots, data)]

    def close(self):
        if self.ring:
            self.ring.close()

    def _receive(self, reply, ring, slot):
        if slots.is_slot_reply(reply):
            assert int(reply) == slot, (int(reply), slot)
            ring.unlink()  # The producer has it mapped now.
            self.on_shared()
            return ring.read(slot)
        ring.release(slot)
        if ring is self.ring:  # Not yet replaced after an earlier one.
            self._fall_back(reply)
        return reply

    def _start_ring(self, data):
        self.shared = False  # One try per layout.
        layout = slots.layout_of(data)
        self.per_request = self.asked_per_request or (batches_per_request(
            slots.slot_bytes(layout), self.prefetch) if layout else 1)
        # The batches in flight, and room for those received and held.
        count = (self.per_request + 1) * self.prefetch
        self.ring, problem = slots.SlotRing.create(layout, count)
        if problem:
            print(f'{self.name} come over the socket ({problem}).',
                  flush=True)

    def _fall_back(self, data):
        """The producer sent a batch instead of using the slot."""
        ring, self.ring = self.ring, None
        ring.close()
        if slots.layout_of(data) != ring.layout:
            self._start_ring(data)  # A ring for the new layout.
        else:
            print(f'{self.name} come over the socket (the producer at '
                  f'{self.peer} cannot open {ring.path}).', flush=True)


class Producer:
    """The producer's side: answers requests that may name slots."""

    def __init__(self):
        self.writer = slots.SlotWriter()

    def answer(self, target, make, layout=None, make_into=None):
        """`make()` for a request without slots; with a `target`, one reply
        per slot it names: the slot number once the batch is in it, made
        there by `make_into(views)` where `layout()` (the next batch's,
        `(key, dtype.str, shape)` each) is known and fits the slot, else
        made by `make()` and copied; the batch itself where the slot cannot
        take it. None (for the whole request) once a maker returns None."""
        if target is None:
            return make()
        replies = []
        for one in slots.split(target):
            reply = self._fill(one, make, layout, make_into)
            if reply is None:
                return None
            replies.append(reply)
        return replies

    def close(self):
        """Unmaps the slots (after the server closed: a request in flight
        may still write to them)."""
        self.writer.close()

    def _fill(self, target, make, layout, make_into):
        known = layout and layout()
        views = known and self.writer.views(target, known)
        if not views:
            batch = make()
            return batch if batch is None else self.writer.write(
                target, batch)
        batch = make_into(views)
        if batch is None:
            return None
        if batch is not views:
            return self.writer.write(target, batch)  # The layout changed.
        return int(target[1])
