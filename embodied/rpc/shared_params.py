"""Parameters from one process to another on the same machine: a
generation-counted double buffer in one file under /dev/shm.

    writer = ParamWriter(layout)          # the learner's side; makes the file
    writer.write(arrays, version)         # into the slot readers do not read
    writer.set_updates(n)                 # the learner's update count
    reader = ParamReader(writer.path, layout)   # the policy's side
    got = reader.read(consume)            # None: nothing newer, or torn
    # got = (generation, version, consume(views of the newest slot))

`layout` is a tuple of (name, dtype, shape): every array the buffer holds.
The file has a header and two slots. The writer fills the slot that does
not hold the newest generation and then publishes it, so a reader of the
newest slot is overwritten only when the writer finishes two writes during
one read. Each slot has a sequence number that is odd while the slot is
being written (a seqlock): a reader notes it before `consume` reads the
views and compares it after; a change means the slot was rewritten under it
(a torn read), and `read` tries again with the newer generation, at most
`tries` times. The protocol relies on the stores of one process becoming
visible to the other in program order, as x86-64 guarantees; every counter
is one aligned 8-byte word.

Policy lag flows back the other way: the reader adds the lag of each policy
call (`add_lag`); the writer's side reads the calls since its last look
(`lags`). One writer and one reader per file.

Cleanup: the writer unlinks the file once the reader has mapped it
(`attached`, which the reader sets), at `close()` and when its process
exits, so nothing is left in /dev/shm when either process is killed after
the reader attached; a file of a writer killed before that is deleted by
the next writer made on the machine (its name carries the writer's pid).
The reader owns nothing: killing it leaves nothing behind. Without
/dev/shm the file lies in the temporary folder.
"""

import atexit
import hashlib
import math
import mmap
import os
import tempfile
import threading
import time

import numpy as np

from embodied.rpc import shm_files

SHM_DIR = shm_files.SHM_DIR
PREFIX = 'embodied-params-'
MAGIC = 0x656d62706172616d  # 'embparam'
_ALIGN = 64

# The header's 8-byte words.
(_MAGIC, _SIGNATURE, _LATEST, _UPDATES, _SEQ0, _SEQ1, _VERSION0, _VERSION1,
 _ATTACHED, _LAG_SUM, _LAG_COUNT, _LAG_MAX, _LAG_EPOCH, _LAG_MAX_EPOCH,
 _WORDS) = range(15)
_HEADER_BYTES = mmap.PAGESIZE


class TornRead(RuntimeError):
    """The slot was rewritten while it was read, `tries` times in a row."""


def signature(layout):
    """An integer that differs between layouts (names, dtypes, shapes)."""
    text = repr(tuple((k, np.dtype(d).str, tuple(s)) for k, d, s in layout))
    return int.from_bytes(hashlib.sha1(text.encode()).digest()[:7], 'little')


def layout_of(arrays):
    """The layout of a dict of arrays, in sorted key order."""
    return tuple((k, np.dtype(arrays[k].dtype).str, tuple(arrays[k].shape))
                 for k in sorted(arrays))


def _spans(layout):
    """(name, dtype, shape, offset) of each array in a slot, and the slot's
    bytes."""
    spans, size = [], 0
    for name, dtype, shape in layout:
        spans.append((name, np.dtype(dtype), tuple(shape), size))
        nbytes = np.dtype(dtype).itemsize * math.prod(shape)
        size += -(-max(nbytes, 1) // _ALIGN) * _ALIGN
    return spans, -(-size // mmap.PAGESIZE) * mmap.PAGESIZE


class _Mapped:
    """The mapped file: header words and both slots' views."""

    def __init__(self, fd, layout, create):
        self.layout = tuple(layout)
        self.spans, self.slot_bytes = _spans(self.layout)
        size = _HEADER_BYTES + 2 * self.slot_bytes
        if create:
            # Reserves the pages now: a full tmpfs fails here with ENOSPC,
            # not with SIGBUS on a later write.
            os.posix_fallocate(fd, 0, size)
        elif os.fstat(fd).st_size != size:
            raise ValueError(
                f'The parameter buffer holds another layout than the '
                f'reader\'s ({os.fstat(fd).st_size} bytes, not {size}).')
        self.map = mmap.mmap(fd, size)
        self.words = np.ndarray((_WORDS,), np.int64, self.map, 0)
        self.floats = np.ndarray((_WORDS,), np.float64, self.map, 0)
        self.slots = [self._views(i) for i in range(2)]

    def _views(self, index):
        start = _HEADER_BYTES + index * self.slot_bytes
        return {name: np.ndarray(shape, dtype, self.map, start + offset)
                for name, dtype, shape, offset in self.spans}

    def close(self):
        self.words = self.floats = None
        self.slots = []
        try:
            self.map.close()
        except BufferError:
            pass  # Views still held elsewhere keep it mapped.


class ParamWriter:
    """The writing side: makes the file and fills its slots. `write` and
    `set_updates` are called from one thread; `lags` from any."""

    def __init__(self, layout, directory=None):
        directory = directory or default_directory()
        self.path, self._mapped = shm_files.create(
            PREFIX, directory, lambda fd: _Mapped(fd, layout, create=True))
        self.layout = self._mapped.layout
        words = self._mapped.words
        words[_SIGNATURE] = signature(self.layout)
        words[_MAGIC] = MAGIC
        self._linked = True
        self._seen = (0.0, 0)  # (lag sum, count) at the last `lags()`.
        self._lock = threading.Lock()
        atexit.register(self.unlink)

    @property
    def generation(self):
        return int(self._mapped.words[_LATEST])

    def write(self, arrays, version):
        """Copies `arrays` (name -> array of the layout's shape, anything
        `np.copyto` takes) into the free slot and publishes it as the next
        generation with `version` (the learner's update count). Returns the
        generation."""
        words = self._mapped.words
        generation = int(words[_LATEST]) + 1
        slot = generation % 2
        words[_SEQ0 + slot] = 2 * generation - 1  # Odd: being written.
        for name, view in self._mapped.slots[slot].items():
            np.copyto(view, arrays[name], casting='no')
        words[_VERSION0 + slot] = version
        words[_SEQ0 + slot] = 2 * generation
        words[_LATEST] = generation
        self._unlink_once_attached()
        return generation

    def set_updates(self, updates):
        """The learner's update count now, for the reader's lag."""
        self._mapped.words[_UPDATES] = int(updates)
        self._unlink_once_attached()

    def lags(self):
        """{'policy_lag/mean', 'policy_lag/max'} over the reader's policy
        calls since the last call, in updates; {} without calls. The max
        counts the calls the reader made since it last saw this call's
        epoch mark (a call racing the mark counts in the next window)."""
        with self._lock:
            words, floats = self._mapped.words, self._mapped.floats
            epoch = int(words[_LAG_EPOCH])
            total, count = float(floats[_LAG_SUM]), int(words[_LAG_COUNT])
            most = int(words[_LAG_MAX])
            fresh = int(words[_LAG_MAX_EPOCH]) == epoch
            words[_LAG_EPOCH] = epoch + 1
            (last_total, last_count), self._seen = self._seen, (total, count)
        calls = count - last_count
        if calls <= 0:
            return {}
        return {'policy_lag/mean': (total - last_total) / calls,
                'policy_lag/max': most if fresh else 0}

    @property
    def attached(self):
        """The reader's pid once it mapped the file, else 0."""
        return int(self._mapped.words[_ATTACHED])

    def _unlink_once_attached(self):
        if self._linked and self._mapped.words[_ATTACHED]:
            self.unlink()

    def unlink(self):
        """Removes the file's name; the memory lives on while mapped."""
        if self._linked:
            self._linked = False
            shm_files.unlink(self.path)

    def close(self):
        self.unlink()
        atexit.unregister(self.unlink)
        self._mapped.close()


class ParamReader:
    """The reading side: maps the writer's file (checked against `layout`)
    and reads its newest slot. One thread reads; `add_lag` from any."""

    def __init__(self, path, layout, tries=8):
        fd = os.open(path, os.O_RDWR)
        try:
            self._mapped = _Mapped(fd, layout, create=False)
        finally:
            os.close(fd)
        words = self._mapped.words
        if int(words[_MAGIC]) != MAGIC or int(words[_SIGNATURE]) != (
                signature(layout)):
            self._mapped.close()
            raise ValueError(
                f'The parameter buffer {path} holds another layout than the '
                f'reader\'s.')
        self.layout = self._mapped.layout
        self.tries = tries
        self.last = 0  # The generation read last.
        self._lock = threading.Lock()
        self._max, self._max_epoch = 0, -1
        words[_ATTACHED] = os.getpid()

    @property
    def generation(self):
        """The newest generation the writer published (0: none yet)."""
        return int(self._mapped.words[_LATEST])

    @property
    def updates(self):
        """The learner's update count, as the writer last set it."""
        return int(self._mapped.words[_UPDATES])

    def read(self, consume=None):
        """(generation, version, consume(views)) of the newest slot, or None
        when it is no newer than the last one read. `consume` must copy what
        it keeps (default: a numpy copy of each view); its result is dropped
        when the slot changed under it. Raises `TornRead` after `tries`
        torn reads in a row."""
        consume = consume or _copies
        words = self._mapped.words
        for _ in range(self.tries):
            generation = int(words[_LATEST])
            if generation <= self.last:
                return None
            slot = generation % 2
            before = int(words[_SEQ0 + slot])
            if before != 2 * generation:
                continue  # Rewritten already: the newest moved on.
            value = consume(self._mapped.slots[slot])
            version = int(words[_VERSION0 + slot])
            if int(words[_SEQ0 + slot]) == before:
                self.last = generation
                return generation, version, value
        raise TornRead(
            f'The parameter slot was rewritten during {self.tries} reads in '
            f'a row.')

    def wait(self, generation, timeout=None, poll=0.001):
        """Waits until the writer published `generation` or a newer one;
        returns whether it did within `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.generation < generation:
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(poll)
        return True

    def add_lag(self, lag):
        """Records one policy call that acted with parameters `lag` updates
        old."""
        with self._lock:
            words, floats = self._mapped.words, self._mapped.floats
            epoch = int(words[_LAG_EPOCH])
            if epoch != self._max_epoch:
                self._max, self._max_epoch = 0, epoch
            self._max = max(self._max, int(lag))
            floats[_LAG_SUM] = float(floats[_LAG_SUM]) + lag
            words[_LAG_MAX] = self._max
            words[_LAG_MAX_EPOCH] = epoch
            words[_LAG_COUNT] = int(words[_LAG_COUNT]) + 1

    def close(self):
        self._mapped.close()


def _copies(views):
    return {k: np.array(v) for k, v in views.items()}


def default_directory():
    """/dev/shm where the machine has it, else the temporary folder."""
    return SHM_DIR if os.path.isdir(SHM_DIR) else tempfile.gettempdir()
