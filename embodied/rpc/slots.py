"""Large replies through shared memory, for a client and server on one machine.

The learner takes about one batch from the replay per few env steps, and with
images a batch is a megabyte or more. Over loopback TCP each batch costs a
send and a receive of all its bytes (about 0.5 ms of CPU on each side on a
small machine). With slots, the client keeps a ring of batch-sized slots in
one file under /dev/shm and names a free slot in its request; the server
writes the batch there and replies with just the slot number:

    ring = SlotRing.create(layout_of(first_batch), slots=8)      # client
    slots = [ring.acquire(), ring.acquire()]     # None while all are in use
    replies = client.call('sample_batch_train', ring.target(slots)).result()
    batches = [ring.read(slot) if is_slot_reply(reply) else reply
               for slot, reply in zip(slots, replies)]

    writer = SlotWriter()                                        # server
    def sample_batch_train(target=None):
        # One batch per slot named, each answered by its slot number (or by
        # the batch itself where the slot cannot be used).
        return [writer.write(one, make_batch()) for one in split(target)]

A request may name several slots, so that one round trip brings several
batches.

A slot is free again once every array read from it has been garbage
collected, so a consumer may keep batches as long as it likes (JAX on CPU may
alias them instead of copying). Whatever rules the shared path out (the
server on another machine, a layout that changed, no /dev/shm or too little
room there) makes the server send the batch itself. The client unlinks the
file as soon as the server has mapped it, so nothing is left in /dev/shm when
either process is killed later; a file left by a client killed before that
is deleted by the next ring made on the machine.

The server writes only into files directly in /dev/shm whose names carry
`PREFIX`, so a peer cannot make it write elsewhere.
"""

import collections
import functools
import math
import mmap
import os
import tempfile
import threading
import weakref

import numpy as np

SHM_DIR = '/dev/shm'
PREFIX = 'embodied-slots-'
_ALIGN = 64  # Bytes; aligned arrays let XLA on CPU use them without a copy.


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


def is_slot_reply(reply):
    """Whether a reply is a slot number rather than the data itself."""
    return isinstance(reply, (int, np.integer)) or (
        isinstance(reply, np.ndarray) and reply.ndim == 0 and
        reply.dtype.kind in 'iu')


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
    """The client's slots; see the module docstring. Thread-safe."""

    def __init__(self, layout, slots, directory=SHM_DIR):
        assert layout and slots >= 1, (layout, slots)
        self.layout = tuple(layout)
        self.signature = signature(self.layout)
        self.stride = slot_bytes(self.layout)
        _remove_stale(directory)
        fd, self.path = tempfile.mkstemp(
            prefix=f'{PREFIX}{os.getpid()}-', dir=directory)
        try:
            # Reserves the pages now: a full tmpfs fails here with ENOSPC
            # instead of killing the server with SIGBUS on a later write.
            os.posix_fallocate(fd, 0, self.stride * slots)
            self._map = mmap.mmap(fd, self.stride * slots)
        except BaseException:
            os.unlink(self.path)
            raise
        finally:
            os.close(fd)
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
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    def close(self):
        """Unlinks the file. The mapping stays until the last batch read
        from it is gone (closing it under live arrays would crash them)."""
        self.unlink()
        self._map = None


def _remove_stale(directory):
    """Deletes ring files whose process died before it unlinked them (it
    was killed between creating one and the server's first write)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        pid = name[len(PREFIX):].split('-', 1)[0]
        if name.startswith(PREFIX) and pid.isdigit() and not _alive(int(pid)):
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # Another user's process.
    return True


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
    """The server's side: writes batches into the slots clients name."""

    def __init__(self, directory=SHM_DIR, keep=8):
        self.directory = os.path.realpath(directory)
        self.keep = keep
        # path -> (mmap, array, {(slot, signature): views})
        self._maps = collections.OrderedDict()
        self._lock = threading.Lock()

    def write(self, target, batch):
        """Writes `batch` into the slot a one-slot `target` (from `split`)
        names and returns the slot number; returns `batch` itself when there
        is no target or it cannot be used."""
        if target is None:
            return batch
        try:
            path, slot, expected = target
            slot = int(slot)
        except (TypeError, ValueError):
            return batch
        layout = layout_of(batch)
        views = layout and self.views(target, layout)
        if not views:
            return batch
        for key, view in views.items():
            np.copyto(view, batch[key])
        return slot

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
