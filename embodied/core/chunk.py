"""Chunks: blocks of consecutive time steps from one worker, and their files.

A chunk holds up to `size` steps as one array per key and links to the chunk
that continues the same worker's stream (`succ`). Every step gets a `stepid`:
the chunk's 16-byte uuid followed by the step's index as 4 big-endian bytes.

Small columns (at most PACK_BYTES per step, `stepid` among them) share one
byte matrix, `packed`, with a row per step, and are views of it: a sampler
copies a sequence's small columns with one slice of that matrix instead of
one per column (`Packing`). Columns added later (`ensure`) and chunks read
from files are separate arrays.

A chunk is written once, after it is complete, to a file named

    {time:020d}-{uuid hex}-{succ hex or 0s}-{length}.npz

so that a loader can work out the chains and the items in them from the
names alone, before it opens any file. Files are written to a temporary name,
fsynced and renamed, so a crash leaves either the whole file or none.
"""

import functools
import io
import math
import os
import re
import threading
import time
import uuid as uuidlib

import numpy as np

from . import checkpoint

UUID_BYTES = 16
INDEX_BYTES = 4
STEPID_BYTES = UUID_BYTES + INDEX_BYTES
NO_SUCC = bytes(UUID_BYTES)

_FILENAME = re.compile(
    r'^(?P<time>\d{20})-(?P<uuid>[0-9a-f]{32})-(?P<succ>[0-9a-f]{32})-'
    r'(?P<length>\d+)\.npz$')
# Temporary files left behind by write_atomic() when a process died mid-write.
_TEMPFILE = re.compile(r'^\d{20}-[0-9a-f]{32}-[0-9a-f]{32}-\d+\.npz\.tmp-\w+$')

PACK_BYTES = 256

_clock_lock = threading.Lock()
_last_time = 0


def unique_time():
    """Nanoseconds since the epoch, strictly increasing within the process, so
    that a chunk always sorts after the one it continues."""
    global _last_time
    with _clock_lock:
        _last_time = max(time.time_ns(), _last_time + 1)
        return _last_time


class ChunkError(Exception):
    """A chunk file that cannot be read; the message names the file and why."""


class Packing:
    """Where each small column lies within a packed row: `fields` maps a
    key to (dtype, shape, byte offset, bytes), `rowbytes` is a row's size.
    One object per set of columns (`packing`), so chunks that share one can
    be told by identity."""

    def __init__(self, columns):
        self.fields, offset = {}, 0
        for key, dtype, shape in columns:
            dtype = np.dtype(dtype)
            offset = -(-offset // dtype.alignment) * dtype.alignment
            nbytes = dtype.itemsize * math.prod(shape)
            self.fields[key] = (dtype, shape, offset, nbytes)
            offset += nbytes
        self.rowbytes = -(-offset // 8) * 8

    def views(self, matrix):
        """The columns within `matrix`, a (rows, rowbytes) uint8 array."""
        return {
            key: matrix[:, offset:offset + nbytes].view(dtype).reshape(
                len(matrix), *shape)
            for key, (dtype, shape, offset, nbytes) in self.fields.items()}


@functools.lru_cache(maxsize=16)
def packing(columns):
    """The `Packing` of the small ones among `columns`, a tuple of (key,
    dtype string, shape); None when fewer than two are small."""
    small = [(k, d, s) for k, d, s in columns
             if np.dtype(d).itemsize * math.prod(s) <= PACK_BYTES]
    return Packing(small) if len(small) >= 2 else None


class Chunk:

    __slots__ = (
        'uuid', 'time', 'size', 'length', 'succ', 'data', 'saved', 'packing',
        'packed')

    def __init__(self, size, uuid=None, created=None):
        if size < 1:
            raise ValueError(f'Chunk size must be >= 1, got {size}.')
        self.uuid = uuid or uuidlib.uuid4().bytes
        self.time = unique_time() if created is None else created
        self.size = size
        self.length = 0
        self.succ = None      # uuid of the chunk that continues this stream
        self.data = {}        # key -> array with `size` rows
        self.saved = False
        self.packing = None   # Packing of the small columns, if packed
        self.packed = None    # (size, packing.rowbytes) uint8 matrix

    def __repr__(self):
        return f'Chunk({self.uuid.hex()[:8]}, {self.length}/{self.size})'

    @property
    def full(self):
        return self.length >= self.size

    @property
    def nbytes(self):
        return sum(v.nbytes for v in self.data.values())

    @property
    def filename(self):
        return filename({'time': self.time, 'uuid': self.uuid,
                         'succ': self.succ, 'length': self.length})

    def append(self, step, row=None):
        """Stores one step: a dict of arrays of fixed shapes and dtypes, or
        with `row`, row `row` of a dict of batched arrays."""
        if self.full:
            raise ValueError(f'{self!r} is full.')
        data, length = self.data, self.length
        if not data:
            self._create(step, row)
        for key, value in step.items():
            if row is not None:
                value = value[row]
            column = data.get(key)
            if column is None:  # A key the first step lacked.
                column = self.ensure(key, value.dtype, value.shape)
            column[length] = value
        self.length = length + 1

    def ensure(self, key, dtype, shape):
        """Gives the chunk a zero-filled column `key` if it has none."""
        if key not in self.data:
            self.data[key] = np.zeros((self.size, *shape), dtype)
        return self.data[key]

    def _create(self, step, row):
        """The columns of the first step: small ones packed, the others
        separate; none zero-filled, as the appends fill every row."""
        columns = (('stepid', '|u1', (STEPID_BYTES,)),) + tuple(
            (key, value.dtype.str, value.shape[0 if row is None else 1:])
            for key, value in step.items())
        self.packing = packing(columns)
        if self.packing:
            self.packed = np.empty(
                (self.size, self.packing.rowbytes), np.uint8)
            self.data.update(self.packing.views(self.packed))
        for key, dtype, shape in columns:
            if key not in self.data:
                self.data[key] = np.empty((self.size, *shape), dtype)
        self.data['stepid'][:] = make_stepids(self.uuid, self.size)

    def trim(self):
        """Frees the rows beyond `length` (for a chunk closed before full)."""
        if self.length < self.size:
            fields = self.packing.fields if self.packing else {}
            self.data = {
                k: v[:self.length].copy() for k, v in self.data.items()
                if k not in fields}
            if self.packing:
                self.packed = self.packed[:self.length].copy()
                self.data.update(self.packing.views(self.packed))
            self.size = self.length

    def write(self, directory):
        """Writes the chunk's steps to `directory`; returns the file path."""
        data = {k: v[:self.length] for k, v in self.data.items()}
        with io.BytesIO() as buffer:
            np.savez_compressed(buffer, **data)
            content = buffer.getvalue()
        path = os.path.join(str(directory), self.filename)
        checkpoint.write_atomic(path, content)
        return path

    @classmethod
    def read(cls, path):
        """Reads a chunk file; raises ChunkError when it is unusable."""
        path = str(path)
        name = parse_filename(os.path.basename(path))
        if not name:
            raise ChunkError(f'{path}: not a chunk file name.')
        try:
            with np.load(path, allow_pickle=False) as archive:
                data = {k: archive[k] for k in archive.files}
        except Exception as e:
            raise ChunkError(f'{path}: unreadable ({type(e).__name__}: {e}).')
        length = name['length']
        stepid = data.get('stepid')
        if stepid is None or stepid.dtype != np.uint8 or (
                stepid.shape != (length, STEPID_BYTES)):
            raise ChunkError(f'{path}: missing or malformed stepid column.')
        if length and stepid[0, :UUID_BYTES].tobytes() != name['uuid']:
            raise ChunkError(f'{path}: stepids belong to another chunk.')
        wrong = {k: v.shape for k, v in data.items() if len(v) != length}
        if wrong:
            raise ChunkError(
                f'{path}: columns {wrong} do not have {length} rows.')
        chunk = cls(max(length, 1), name['uuid'], name['time'])
        chunk.size = length
        chunk.length = length
        chunk.succ = name['succ']
        chunk.data = data
        chunk.saved = True
        return chunk


def make_stepids(chunk_uuid, size):
    """The (size, 20) uint8 stepids of a chunk's rows."""
    stepids = np.empty((size, STEPID_BYTES), np.uint8)
    stepids[:, :UUID_BYTES] = np.frombuffer(chunk_uuid, np.uint8)
    indices = np.arange(size, dtype='>u4').view(np.uint8).reshape(size, 4)
    stepids[:, UUID_BYTES:] = indices
    return stepids


def split_stepids(stepids):
    """Chunk uuids (bytes) and row indices of an (n, 20) uint8 stepid array."""
    stepids = np.ascontiguousarray(stepids, np.uint8)
    if stepids.ndim != 2 or stepids.shape[1] != STEPID_BYTES:
        raise ValueError(
            f'stepids must have shape (n, {STEPID_BYTES}), got '
            f'{stepids.shape}.')
    uuids = [row.tobytes() for row in stepids[:, :UUID_BYTES]]
    indices = stepids[:, UUID_BYTES:].copy().view('>u4').reshape(-1)
    return uuids, indices.astype(np.int64)


def filename(fields):
    """The file name of a chunk with `fields` time, uuid, succ and length
    (the inverse of `parse_filename`)."""
    succ = (fields['succ'] or NO_SUCC).hex()
    return (f"{fields['time']:020d}-{fields['uuid'].hex()}-{succ}-"
            f"{fields['length']}.npz")


def parse_filename(name):
    """The fields of a chunk file name as a dict, or None for other names."""
    match = _FILENAME.match(name)
    if not match:
        return None
    succ = bytes.fromhex(match['succ'])
    return {
        'time': int(match['time']),
        'uuid': bytes.fromhex(match['uuid']),
        'succ': None if succ == NO_SUCC else succ,
        'length': int(match['length']),
    }


def is_tempfile(name):
    return bool(_TEMPFILE.match(name))
