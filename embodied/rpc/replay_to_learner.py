"""Replay -> learner: the replay's batches to the learner, through
shared-memory slots where both are on one machine, else over the socket.
The learner's side is the reader (`Consumer`, and `BatchStream`
prefetching its batches), the replay's the producer (`Producer`, writing
with `SlotWriter`); the slots are one file under /dev/shm (`SlotRing`).

    # Consumer (the learner's stream of one replay method):
    consumer = Consumer(functools.partial(client.call, 'sample_batch_train'),
                        'Learner: train batches', shared=True, prefetch=4)
    pending = consumer.request()               # a call, naming free slots
    batches = consumer.receive(pending, rpc.result(pending.future))
    # None: the producer has nothing more (it shut down)

    # Producer (the replay's method), one reply per slot named,
    # {'slot': n} or {'batch': batch} (`slot_reply`, `batch_reply`):
    producer = Producer()
    def sample_batch_train(target=None):
        return producer.answer(target, make, layout, make_into)

With images a batch is a megabyte or more, and over loopback TCP each costs
a send and a receive of all its bytes, CPU on each side. So the consumer asks plainly until the first batch shows
the layout; then it keeps a ring of batch-sized slots in one file under
/dev/shm (`SlotRing`, `per_request` batches a round trip) and names free
ones in each request. The producer makes each batch in the slot where it
can (`make_into(views)`, given `layout()`), else makes it and copies it
there (`SlotWriter`), and replies with the slot number. Where a slot cannot
take the batch (another machine, a layout that changed, no /dev/shm or too
little room there) the batch itself comes back (a reply says which it is:
its one key, `SLOT` or `BATCH`, is its kind), and the consumer makes a
ring for the new layout or stays on the socket, with a line saying why.
The other direction, actor -> replay, is `actor_to_replay`.

A slot is free again once every array read from it has been garbage
collected, so a consumer may keep batches as long as it likes (JAX on CPU
may alias them instead of copying). The consumer unlinks the file as soon
as the producer has mapped it, so nothing is left in /dev/shm when either
process is killed later; a file left by a consumer killed before that is
deleted by the next ring made on the machine. The producer writes only
into files directly in /dev/shm whose names carry `PREFIX`, so a peer
cannot make it write elsewhere.
"""

import collections
import functools
import math
import mmap
import os
import threading
import weakref

import numpy as np

from embodied.rpc import shm_files

SHM_DIR = shm_files.SHM_DIR
PREFIX = 'embodied-slots-'
_ALIGN = 64  # Bytes; aligned arrays let XLA on CPU use them without a copy.

RING_BYTES = 32 << 20
MAX_PER_REQUEST = 4  # With prefetch 4, at most 16 batches sampled ahead.


Pending = collections.namedtuple('Pending', 'future ring slots')

# The reply for one slot a request names: a dict whose one key is its kind.
# A key costs the wire a few bytes of the message's structure, no buffer.
SLOT = 'slot'    # {SLOT: n}: the batch is in slot n.
BATCH = 'batch'  # {BATCH: batch}: the slot could not take it; here it is.


def slot_reply(slot):
    """The reply saying the batch is in `slot`."""
    return {SLOT: int(slot)}


def batch_reply(batch):
    """The reply carrying `batch` itself, for a slot that cannot take it."""
    return {BATCH: batch}


def batches_per_request(nbytes, prefetch):
    """How many batches of `nbytes` one request asks for: as many as
    keep the ring (`prefetch` requests in flight plus one held) within
    `RING_BYTES`, between 1 and `MAX_PER_REQUEST`. Small batches share a
    round trip; large ones do not fill /dev/shm."""
    fit = RING_BYTES // (nbytes * prefetch) - 1
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
        if SLOT in reply:
            assert int(reply[SLOT]) == slot, (reply[SLOT], slot)
            ring.unlink()  # The producer has it mapped now.
            self.on_shared()
            return ring.read(slot)
        batch = reply[BATCH]
        ring.release(slot)
        if ring is self.ring:  # Not yet replaced after an earlier one.
            self._fall_back(batch)
        return batch

    def _start_ring(self, data):
        self.shared = False  # One try per layout.
        layout = layout_of(data)
        self.per_request = self.asked_per_request or (batches_per_request(
            slot_bytes(layout), self.prefetch) if layout else 1)
        # The batches in flight, and room for those received and held.
        count = (self.per_request + 1) * self.prefetch
        self.ring, problem = SlotRing.create(layout, count)
        if problem:
            print(f'{self.name} come over the socket ({problem}).',
                  flush=True)

    def _fall_back(self, data):
        """The producer sent a batch instead of using the slot."""
        ring, self.ring = self.ring, None
        ring.close()
        if layout_of(data) != ring.layout:
            self._start_ring(data)  # A ring for the new layout.
        else:
            print(f'{self.name} come over the socket (the producer at '
                  f'{self.peer} cannot open {ring.path}).', flush=True)


class BatchStream:
    """The batches of a `Consumer` as an iterator, `consumer.prefetch`
    requests ahead from the start. `wait(future)` waits for a reply (None:
    stop waiting); the stream ends (StopIteration) on a None. `client`, if
    given, is the one the calls go through, closed with the stream."""

    def __init__(self, consumer, wait, client=None):
        self.consumer, self.wait, self.client = consumer, wait, client
        self.futures = collections.deque(
            consumer.request() for _ in range(consumer.prefetch))
        self.ready = collections.deque()  # Batches received, not yet used.
        self.received = 0

    def ready_soon(self):
        """Whether a batch has arrived (so `next` will not wait long)."""
        return (self.received > 0 or bool(self.ready) or
                self.futures[0].future.done())

    def __iter__(self):
        return self

    def __next__(self):
        if not self.ready:
            pending = self.futures.popleft()
            batches = self.consumer.receive(
                pending, self.wait(pending.future))
            if batches is None:
                raise StopIteration
            self.ready.extend(batches)
            # Asked after the slots of this reply are read, so that they
            # count as in use while the new request takes its slots.
            self.futures.append(self.consumer.request())
        self.received += 1
        return self.ready.popleft()

    def close(self):
        self.consumer.close()
        if self.client:
            self.client.close(1)


class Producer:
    """The producer's side: answers requests that may name slots."""

    def __init__(self):
        self.writer = SlotWriter()

    def answer(self, target, make, layout=None, make_into=None):
        """`make()` for a request without slots; with a `target`, one reply
        per slot it names: the slot number once the batch is in it, made
        there by `make_into(views)` where `layout()` (the next batch's,
        `(key, dtype.str, shape)` each) is known and fits the slot, else
        made by `make()` and copied; the batch itself where the slot cannot
        take it (`slot_reply`, `batch_reply`). None (for the whole request)
        once a maker returns None."""
        if target is None:
            return make()
        replies = []
        for one in split(target):
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
        return slot_reply(target[1])


# The slots: a ring of them for the consumer, the writer for the producer.


def layout_of(batch):
    """The `(key, dtype, shape)` of every array of a batch, or None when the
    batch is not a non-empty dict of arrays."""
    if not isinstance(batch, dict) or not batch:
        return None
    if not all(isinstance(v, np.ndarray) and v.dtype != object
               for v in batch.values()):
        return None
    return tuple((str(k), v.dtype.str, tuple(v.shape))
                 for k, v in batch.items())


@functools.lru_cache(maxsize=64)
def signature(layout):
    """A layout as one short string, compared by the server."""
    return ';'.join(f'{k}:{d}:{",".join(map(str, s))}' for k, d, s in layout)


def slot_bytes(layout):
    """Bytes one slot of `layout` takes in a ring (page-aligned)."""
    return _offsets(tuple(layout))[1]


@functools.lru_cache(maxsize=64)
def _offsets(layout):
    """Byte offsets of the arrays within a slot, and the slot's stride."""
    offsets, size = [], 0
    for _, dtype, shape in layout:
        offsets.append(size)
        nbytes = np.dtype(dtype).itemsize * math.prod(shape)
        size += max(_ALIGN, -(-nbytes // _ALIGN) * _ALIGN)
    stride = -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
    return offsets, stride


def _views(whole, layout, start):
    """The arrays of a slot at byte `start` of the uint8 array `whole`
    (their base, which keeps it alive)."""
    return {key: np.ndarray(shape, dtype, whole, begin)
            for key, dtype, shape, begin in _spans(layout, start)}


@functools.lru_cache(maxsize=256)
def _spans(layout, start):
    """(key, dtype, shape, first byte) of each array of a slot at byte
    `start`."""
    offsets, _ = _offsets(layout)
    return tuple(
        (key, np.dtype(dtype), shape, start + offset)
        for (key, dtype, shape), offset in zip(layout, offsets))


class SlotRing:
    """The consumer's slots in one file under /dev/shm. Thread-safe."""

    def __init__(self, layout, slots, directory=SHM_DIR):
        assert layout and slots >= 1, (layout, slots)
        self.layout = tuple(layout)
        self.signature = signature(self.layout)
        self.stride = slot_bytes(self.layout)
        size = self.stride * slots

        def reserve(fd):
            # Reserves the pages now: a full tmpfs fails here with ENOSPC
            # instead of killing the server with SIGBUS on a later write.
            os.posix_fallocate(fd, 0, size)
            return mmap.mmap(fd, size)

        self.path, self._map = shm_files.create(PREFIX, directory, reserve)
        self._lock = threading.Lock()
        self._free = collections.deque(range(slots))
        self._linked = True

    @classmethod
    def create(cls, layout, slots, directory=SHM_DIR):
        """A ring, or None (and why) when shared memory is unavailable."""
        if not layout:
            return None, 'the data is no dict of arrays'
        if not os.path.isdir(directory):
            return None, f'{directory} does not exist'
        if not hasattr(os, 'posix_fallocate'):
            return None, 'this system has no posix_fallocate'
        try:
            return cls(layout, slots, directory), None
        except OSError as e:
            return None, f'{directory}: {e.strerror or e}'

    def acquire(self):
        """A free slot number, or None while every slot is in use."""
        with self._lock:
            return self._free.popleft() if self._free else None

    def release(self, slot):
        """Gives back a slot that was acquired but not read (and, called by
        `read`'s finalizer, one whose batch is gone)."""
        with self._lock:
            self._free.append(slot)

    def target(self, slots):
        """What a request names for the server to write into: a list of
        slot numbers (see `split`)."""
        return [self.path, [int(slot) for slot in slots], self.signature]

    def read(self, slot):
        """The batch in `slot`, as arrays that share its memory. The slot is
        free again once all of them are garbage collected."""
        # Every array is a view of one array over the slot, which therefore
        # lives exactly as long as the last of them.
        whole = np.frombuffer(
            self._map, np.uint8, self.stride, slot * self.stride)
        weakref.finalize(whole, self.release, slot)
        return _views(whole, self.layout, 0)

    def unlink(self):
        """Removes the file's name; the memory lives on while mapped."""
        if self._linked:
            self._linked = False
            shm_files.unlink(self.path)

    def close(self):
        """Unlinks the file. The mapping stays until the last batch read
        from it is gone (closing it under live arrays would crash them)."""
        self.unlink()
        self._map = None


def split(target):
    """The one-slot targets, `[path, slot, signature]`, in a request's
    target, for `SlotWriter.write`; `[target]` when it is malformed (the
    writer then answers with the batch itself)."""
    try:
        path, slots, expected = target
        return [[path, slot, expected] for slot in slots]
    except (TypeError, ValueError):
        return [target]


class SlotWriter:
    """The producer's side: writes batches into the slots consumers name."""

    def __init__(self, directory=SHM_DIR, keep=8):
        self.directory = os.path.realpath(directory)
        self.keep = keep
        # path -> (mmap, array, {(slot, signature): views})
        self._maps = collections.OrderedDict()
        self._lock = threading.Lock()

    def write(self, target, batch):
        """Writes `batch` into the slot a one-slot `target` (from `split`)
        names and returns its `slot_reply`; the `batch_reply` when there is
        no target or it cannot be used."""
        layout = target is not None and layout_of(batch)
        views = layout and self.views(target, layout)
        if not views:
            return batch_reply(batch)
        for key, view in views.items():
            np.copyto(view, batch[key])
        return slot_reply(target[1])

    def views(self, target, layout):
        """Writable arrays in the slot a one-slot `target` names, one per
        `(key, dtype, shape)` of `layout` (dtype as `np.dtype(...).str`),
        so that a batch can be made in place; None when the target cannot
        take a batch of that layout (then send the batch itself)."""
        try:
            path, slot, expected = target
            slot = int(slot)
        except (TypeError, ValueError):
            return None
        if slot < 0 or signature(layout) != expected:
            return None
        entry = self._open(path)
        if entry is None:
            return None
        whole, cache = entry
        views = cache.get((slot, expected))
        if views is None:
            stride = slot_bytes(layout)
            if (slot + 1) * stride > len(whole):
                return None
            views = _views(whole, layout, slot * stride)
            # Kept with the mapping, which they keep open until it goes.
            cache[(slot, expected)] = views
        return views

    def _open(self, path):
        """A uint8 array over the mapped file `path` and a dict for views of
        its slots, or None."""
        with self._lock:
            entry = self._maps.get(path)
            if entry is not None:
                self._maps.move_to_end(path)
                return entry[1:]
            if not self._allowed(path):
                return None
            try:
                fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
            except OSError:
                return None  # Another machine, or the client unlinked it.
            try:
                mapping = mmap.mmap(fd, 0)
            except (OSError, ValueError):
                return None
            finally:
                os.close(fd)
            whole = np.frombuffer(mapping, np.uint8)
            self._maps[path] = (mapping, whole, {})
            while len(self._maps) > self.keep:
                # Only the mapping is kept: its arrays must go first.
                _close(self._maps.popitem(last=False)[1][0])
            return whole, self._maps[path][2]

    def _allowed(self, path):
        if not isinstance(path, str):
            return False
        folder, name = os.path.split(path)
        return (name.startswith(PREFIX) and '/' not in name and
                os.path.realpath(folder) == self.directory)

    def close(self):
        with self._lock:
            mappings = [entry[0] for entry in self._maps.values()]
            self._maps.clear()  # Drops the arrays, so the mappings close.
            for mapping in mappings:
                _close(mapping)


def _close(mapping):
    try:
        mapping.close()
    except BufferError:
        pass  # A write is still using it; it goes with its last view.
