"""Replay: fixed-length sequences cut from each worker's stream of steps.

The replay process of the parallel runner owns a `Replay` and serves it::

    replay.add(transition, worker=envid)        # actor, every env step
    batch = replay.sample(batch_size, 'train')  # learner: (B, length, ...)
    replay.update({'stepid': ..., **context})   # learner, after training
    stats = replay.stats()                      # periodically, for the logger
    data = replay.save()                        # checkpoint: writes chunks
    replay.load(data)                           # at start: reads them back

Steps are stored in per-worker chunks (see `chunk.py`) that link to the chunk
continuing the same worker's stream. An item is the start of a sequence of
`length` consecutive steps of one worker; a sequence never mixes workers but
may span chunks. At `capacity` items the oldest item is evicted, and a chunk
is freed once no item, pending start or predecessor refers to it. All methods
are thread-safe.
"""

import collections
import math
import threading

import elements
import numpy as np

from . import chunk as chunklib
from . import limiters
from . import replay_persistence as persistence
from . import selectors

MODES = ('train', 'report', 'eval')


class _Stream:
    """A worker's chunk being filled and the starts waiting for enough steps."""

    __slots__ = ('chunk', 'pending', 'count')

    def __init__(self, chunk_uuid):
        self.chunk = chunk_uuid
        self.pending = collections.deque()  # (chunk uuid, index, position)
        self.count = 0                      # steps this worker has added


class Replay:
    """Stores steps from several workers and samples fixed-length sequences.

    Args:
      length: steps per sampled sequence.
      capacity: maximum number of items (sequence starts); None is unbounded.
      directory: where `save()` writes chunk files and `load()` reads them.
      chunksize: steps per chunk.
      online: in 'train' mode, serve fresh non-overlapping sequences first.
      selector: chooses items to sample (default `selectors.Uniform(seed)`).
      save_wait: make `save()` return only after the files are written.
      name: used in messages.
      seed: seeds the default selector.
    """

    def __init__(
            self, length, capacity=None, directory=None, chunksize=1024,
            online=False, selector=None, save_wait=False, name='unnamed',
            seed=0):
        if not _is_int(length) or length < 1:
            raise ValueError(
                f'Replay length must be an integer >= 1, got {length!r}.')
        if capacity is not None and (not _is_int(capacity) or capacity < 1):
            raise ValueError(
                f'Replay capacity must be an integer >= 1 or None, got '
                f'{capacity!r}.')
        if not _is_int(chunksize) or chunksize < 1:
            raise ValueError(
                f'Replay chunksize must be an integer >= 1, got {chunksize!r}.')
        self.length = int(length)
        self.capacity = None if capacity is None else int(capacity)
        self.chunksize = int(chunksize)
        self.online = bool(online)
        self.save_wait = bool(save_wait)
        self.name = name
        self.directory = elements.Path(directory) if directory else None
        if self.directory:
            self.directory.mkdir()
        # Test against None: a selector with __len__ is falsy while empty.
        self._selector = (
            selectors.Uniform(seed) if selector is None else selector)
        if len(self._selector):
            raise ValueError('Replay needs an empty selector.')
        self._stepids = getattr(self._selector, 'uses_stepids', True)

        self._lock = threading.RLock()
        self._chunks = {}        # uuid -> Chunk
        self._refs = {}          # uuid -> references that keep the chunk
        self._items = {}         # itemid -> (chunk uuid, index)
        self._first_live = {}    # uuid -> index of its oldest item not evicted
        self._fifo = collections.deque()
        self._next_itemid = 0
        self._streams = {}       # worker -> _Stream
        self._spec = {'stepid': (np.dtype(np.uint8), (chunklib.STEPID_BYTES,))}
        self._layout = (None, None)  # `layout`'s last answer and its version.
        self._step_keys = None   # keys every added step carries
        self._known = set()      # uuids of all chunks created or loaded here
        maxlen = self.capacity // self.length + 1 if self.capacity else None
        self._online_queue = collections.deque(maxlen=maxlen)
        self._files = persistence.ChunkFiles(self.directory, name)
        self._released = threading.Event()
        self._metrics = {'inserts': 0, 'samples': 0, 'updates': 0}

    @property
    def selector(self):
        return self._selector

    def __len__(self):
        return len(self._items)

    # Adding ---------------------------------------------------------------

    def add(self, step, worker=0):
        """Appends one time step (a dict of arrays) to `worker`'s stream.

        Keys starting with `log/` are dropped. Every step of the replay must
        carry the same keys with the same shapes; each gets a `stepid`.
        """
        worker = _worker_key(worker)
        step = _prepare_step(step, self.name)
        with elements.timer.section('replay_add'), self._lock:
            step = self._check_step(step, worker)
            self._append(step, worker)

    def add_batch(self, steps, workers):
        """Adds row `i` of every array in `steps` as a step of `workers[i]`,
        in order: the same as calling `add` for each row, with the checks
        done once for the whole batch."""
        workers = [_worker_key(w) for w in workers]
        steps = _prepare_step(steps, self.name)
        for key, value in steps.items():
            if value.ndim < 1 or len(value) != len(workers):
                raise ValueError(
                    f"Replay '{self.name}'.add_batch: '{key}' has shape "
                    f"{value.shape}, expected a first axis of "
                    f"{len(workers)} rows, one per worker.")
        if not workers:
            return
        with elements.timer.section('replay_add'), self._lock:
            # The checks see the first row; all rows share dtype and shape.
            first = self._check_step(
                {k: v[0] for k, v in steps.items()}, workers[0])
            steps = {k: steps[k].astype(first[k].dtype, copy=False)
                     for k in first}
            for i, worker in enumerate(workers):
                self._append(steps, worker, i)

    def _append(self, step, worker, row=None):
        """Appends `step` (row `row` of it, if given) to `worker`'s stream."""
        stream = self._streams.get(worker)
        if stream is None:
            stream = _Stream(self._new_chunk(refs=1).uuid)
            self._streams[worker] = stream
        chunk = self._chunks[stream.chunk]
        index = chunk.length
        chunk.append(step, row)
        self._refs[chunk.uuid] += 1
        stream.pending.append((chunk.uuid, index, stream.count))
        stream.count += 1
        if chunk.full:
            self._complete(stream)
        if len(stream.pending) >= self.length:
            uuid, index, position = stream.pending.popleft()
            itemid = self._insert(uuid, index)
            if self.online and position % self.length == 0:
                self._online_queue.append(itemid)

    def _check_step(self, step, worker):
        if self._step_keys is not None and step.keys() != self._step_keys:
            missing = sorted(self._step_keys - step.keys())
            extra = sorted(step.keys() - self._step_keys)
            raise ValueError(
                f"Replay '{self.name}': step from worker {worker!r} has other "
                f"keys than earlier steps: missing {missing}, unexpected "
                f"{extra}.")
        for key, value in step.items():
            spec = self._spec.get(key)
            if spec is None or spec[0] != value.dtype or spec[1] != value.shape:
                self._check_column(key, value.dtype, value.shape, worker)
                dtype = self._spec[key][0]
                if value.dtype != dtype:
                    step[key] = value.astype(dtype)
        if self._step_keys is None:
            self._step_keys = frozenset(step)
        return step

    def _check_column(self, key, dtype, shape, worker=None):
        """Registers a new column, or raises if a value does not fit one."""
        if key not in self._spec:
            self._spec[key] = (np.dtype(dtype), tuple(shape))
            return
        problem = self._column_problem(key, dtype, shape)
        if problem:
            source = '' if worker is None else f' from worker {worker!r}'
            raise ValueError(
                f"Replay '{self.name}': key '{key}'{source} {problem}.")

    def _column_problem(self, key, dtype, shape):
        if key not in self._spec:
            return None
        want_dtype, want_shape = self._spec[key]
        castable = np.can_cast(dtype, want_dtype, 'same_kind')
        if tuple(shape) == want_shape and castable:
            return None
        return (
            f'expected dtype {want_dtype} shape {want_shape}, got dtype '
            f'{np.dtype(dtype)} shape {tuple(shape)}')

    def _new_chunk(self, refs):
        chunk = chunklib.Chunk(self.chunksize)
        self._chunks[chunk.uuid] = chunk
        self._refs[chunk.uuid] = refs
        self._known.add(chunk.uuid)
        return chunk

    def _complete(self, stream):
        """Closes the stream's chunk and continues the stream in a new one."""
        chunk = self._chunks[stream.chunk]
        chunk.trim()
        # The new chunk is referenced as the stream's current chunk and by its
        # predecessor, which sequences starting there may run into.
        succ = self._new_chunk(refs=2)
        chunk.succ = succ.uuid
        stream.chunk = succ.uuid
        self._release(chunk.uuid)

    def _insert(self, uuid, index):
        # The item takes over the reference its pending start held.
        while self.capacity and len(self._items) >= self.capacity:
            self._evict()
        itemid = self._next_itemid
        self._next_itemid += 1
        self._items[itemid] = (uuid, index)
        self._fifo.append(itemid)
        self._selector[itemid] = (
            self._read(uuid, index, 'stepid') if self._stepids else None)
        self._metrics['inserts'] += 1
        return itemid

    def _evict(self):
        itemid = self._fifo.popleft()
        del self._selector[itemid]
        uuid, index = self._items.pop(itemid)
        self._first_live[uuid] = index + 1
        self._release(uuid)

    def _release(self, uuid):
        """Drops one reference; frees the chunk (and so on down its chain)
        when none is left."""
        while uuid is not None:
            self._refs[uuid] -= 1
            if self._refs[uuid] > 0:
                return
            del self._refs[uuid]
            self._first_live.pop(uuid, None)
            chunk = self._chunks.pop(uuid)
            uuid = chunk.succ if chunk.succ in self._refs else None

    def _segments(self, uuid, index):
        """(chunk, start, count) pieces that make up the sequence at a start."""
        segments, remaining = [], self.length
        chunk = self._chunks[uuid]
        while True:
            count = min(remaining, chunk.length - index)
            segments.append((chunk, index, count))
            remaining -= count
            if not remaining:
                return segments
            chunk, index = self._chunks[chunk.succ], 0

    def _read(self, uuid, index, key):
        parts = [
            c.data[key][s:s + n] for c, s, n in self._segments(uuid, index)]
        return parts[0] if len(parts) == 1 else np.concatenate(parts, 0)

    # Sampling -------------------------------------------------------------

    def sample(self, batch, mode='train', out=None):
        """A batch of sequences: dict of arrays shaped (batch, length, ...).

        Holds every key ever added or written by `update`, plus `stepid`.
        `is_first` is set at the start of each sequence and `is_last` before
        every `is_first` inside it. Waits while the replay is empty (raising
        `limiters.Released` if `close()` is called meanwhile).

        With `out` (a dict of arrays, e.g. views of a shared-memory slot, see
        `layout`), the sequences are copied straight into those arrays and
        `out` is returned, when its keys, dtypes and shapes are the batch's;
        otherwise new arrays are returned as without it.
        """
        if mode not in MODES:
            raise ValueError(
                f'Replay mode must be one of {MODES}, got {mode!r}.')
        if not _is_int(batch) or batch < 1:
            raise ValueError(
                f'Replay batch must be an integer >= 1, got {batch!r}.')
        message = (
            f"Replay '{self.name}' is empty: sampling waits until one worker "
            f"has added {self.length} steps")
        with elements.timer.section('replay_sample'):
            while True:
                limiters.wait(
                    lambda: len(self._items) > 0, message, self._fill_state,
                    release=self._released)
                with self._lock:
                    if not self._items:
                        continue
                    draws = [self._draw(mode) for _ in range(batch)]
                    spec = dict(self._spec)
                    if mode == 'train':
                        self._metrics['samples'] += batch
                break
            # Chunks stay valid outside the lock: a freed chunk is only dropped
            # from the index, and appends never touch rows of stored items.
            if out is not None and not _fits(out, spec, batch, self.length):
                out = None
            data = _assemble(draws, spec, self.length, out)
        return _mark_boundaries(data)

    def sampler(self, batch, mode='train'):
        """`sample(batch, mode)` as a callable of no arguments that can also
        fill given arrays (`Sampler`): what a stream of this replay's batches
        wraps (`streams.Stateless(replay.sampler(16, 'train'))`) to make each
        batch straight in a shared-memory slot."""
        return Sampler(self, batch, mode)

    def layout(self, batch):
        """`(key, dtype.str, shape)` of each array of `sample(batch)`, in
        its order, for the keys stored so far (the tuple is the same object
        while they stay the same)."""
        with self._lock:
            # The spec only grows (add, update): its size tells its version.
            version = (batch, len(self._spec))
            if self._layout[0] != version:
                self._layout = version, tuple(
                    (key, np.dtype(dtype).str, (batch, self.length, *shape))
                    for key, (dtype, shape) in self._spec.items())
            return self._layout[1]

    def _draw(self, mode):
        if self.online and mode == 'train':
            while self._online_queue:
                item = self._items.get(self._online_queue.popleft())
                if item:
                    return self._segments(*item)
        return self._segments(*self._items[self._selector()])

    def _fill_state(self):
        with self._lock:
            longest = max((s.count for s in self._streams.values()), default=0)
            return {
                'items': len(self._items), 'workers': len(self._streams),
                'longest_stream': longest, 'length': self.length}

    # Updating -------------------------------------------------------------

    def update(self, data):
        """Writes values back into stored steps, found by `data['stepid']`.

        `data['stepid']` has shape (batch, time, 20). Other keys hold arrays of
        shape (batch, time, ...) that replace the stored values of those steps
        (a new key starts as zeros for all other steps); `priority`
        (batch, time) goes to the selector's `prioritize`. Steps that were
        evicted already are skipped.
        """
        if 'stepid' not in data:
            raise KeyError(
                f"Replay '{self.name}'.update needs 'stepid', got keys "
                f"{sorted(data)}.")
        stepid = np.asarray(data['stepid'])
        if stepid.ndim != 3 or stepid.shape[-1] != chunklib.STEPID_BYTES:
            raise ValueError(
                f"Replay '{self.name}'.update: stepid must have shape (batch, "
                f"time, {chunklib.STEPID_BYTES}), got {stepid.shape}.")
        shape = stepid.shape[:2]
        values = {}
        for key, value in data.items():
            if key == 'stepid':
                continue
            value = np.asarray(value)
            if value.shape[:2] != shape:
                raise ValueError(
                    f"Replay '{self.name}'.update: '{key}' must start with "
                    f"(batch, time) = {shape} like stepid, got {value.shape}.")
            values[key] = value.reshape((-1, *value.shape[2:]))
        priority = values.pop('priority', None)
        if priority is not None and priority.ndim != 1:
            raise ValueError(
                f"Replay '{self.name}'.update: priority must have shape "
                f"(batch, time), got {np.asarray(data['priority']).shape}.")
        stepids = stepid.reshape((-1, chunklib.STEPID_BYTES))
        with elements.timer.section('replay_update'), self._lock:
            self._metrics['updates'] += len(stepids)
            if priority is not None and hasattr(self._selector, 'prioritize'):
                self._selector.prioritize(stepids, priority)
            if values:
                for key, value in values.items():
                    self._check_column(key, value.dtype, value.shape[1:])
                self._write(stepids, values)

    def _write(self, stepids, values):
        uuids, indices = chunklib.split_stepids(stepids)
        rows_by_chunk = collections.defaultdict(list)
        for row, uuid in enumerate(uuids):
            rows_by_chunk[uuid].append(row)
        for uuid, rows in rows_by_chunk.items():
            chunk = self._chunks.get(uuid)
            if chunk is None:
                continue
            rows = np.asarray(rows)
            targets = indices[rows]
            keep = targets < chunk.length
            if not keep.any():
                continue
            rows, targets = rows[keep], targets[keep]
            for key, value in values.items():
                dtype, shape = self._spec[key]
                chunk.ensure(key, dtype, shape)[targets] = value[rows]

    # Statistics -----------------------------------------------------------

    def stats(self):
        """Sizes now, and counts since the previous call to stats()."""
        with self._lock:
            metrics = dict(self._metrics)
            self._metrics = dict.fromkeys(self._metrics, 0)
            nbytes = sum(c.nbytes for c in self._chunks.values())
            stats = {
                'items': len(self._items),
                'chunks': len(self._chunks),
                'workers': len(self._streams),
                'ram_bytes': nbytes,
                'ram_gb': nbytes / 1024 ** 3,
                'online_queue': len(self._online_queue),
                **metrics,
            }
        inserts = metrics['inserts']
        stats['replay_ratio'] = (
            self.length * metrics['samples'] / inserts if inserts else math.nan)
        return stats

    @staticmethod
    def estimate_bytes(spaces, capacity, length, chunksize=1024, workers=1):
        """RAM a full replay needs: bytes per step (with stepid) x steps held.

        `spaces` maps keys to `elements.Space` (`log/` keys are ignored).
        Besides the `capacity` steps where items start, each worker holds the
        `length - 1` steps that end its newest item, a chunk being filled and
        a partly evicted oldest chunk.
        Keys that only `update` writes (replay context) count only if their
        spaces are passed too.
        """
        if not capacity:
            raise ValueError('estimate_bytes needs a finite capacity.')
        per_step = chunklib.STEPID_BYTES
        for key, space in spaces.items():
            if key.startswith('log/'):
                continue
            per_step += int(np.prod(space.shape, dtype=np.int64)) * (
                np.dtype(space.dtype).itemsize)
        steps = int(capacity) + workers * (length - 1 + 2 * chunksize)
        return per_step * steps

    # Saving and loading (the files: replay_persistence.py) ---------------

    def save(self):
        """Writes the chunks not yet on disk to `directory`.

        Each worker's chunk in progress is closed first (its stream continues
        in a new chunk), so every file is complete when written and never
        rewritten; values that `update` writes into a chunk after its file was
        written stay in memory only. Writes run in the background unless
        `save_wait`. Returns a small dict for the checkpoint that names the
        chunks held now and their first item, so that `load` can restore
        exactly these items.
        """
        if not self.directory:
            return {'directory': None}
        self._files.raise_full_disk()
        with elements.timer.section('replay_save'):
            with self._lock:
                for stream in self._streams.values():
                    if self._chunks[stream.chunk].length:
                        self._complete(stream)
                todo = [
                    c for c in self._chunks.values()
                    if c.length and not c.saved]
                for chunk in todo:
                    chunk.saved = True
                futures = self._files.write(todo)
                data = {
                    'directory': str(self.directory),
                    'time': chunklib.unique_time(),
                    'chunks': {
                        uuid.hex(): self._first_live.get(uuid, 0)
                        for uuid in self._chunks},
                    # The chunks with a file, so a load can name lost ones.
                    'files': sorted(
                        uuid.hex() for uuid, c in self._chunks.items()
                        if c.saved),
                }
            if self.save_wait:
                for future in futures:
                    future.result()
        return data

    def load(self, data=None):
        """Reads chunk files from `directory` and rebuilds the items.

        With `data` from `save()`, it reads the chunks that were held at that
        save plus those created after it, and skips the items that had been
        evicted already. Without, it reads all files. Either way it reads the
        newest first, only as many as fill the free capacity, and skips chunks
        this replay already holds or held, so loading twice adds nothing.
        Unreadable files are reported and skipped; temporary files that an
        interrupted write left (older than
        `replay_persistence.STALE_TEMPFILE_SECONDS`) are removed. Loaded items count as older than items already present.
        """
        if not self.directory:
            return
        with elements.timer.section('replay_load'):
            self._files.wait()
            entries, skips = self._files.entries(data)
            with self._lock:
                entries = [e for e in entries if e['uuid'] not in self._known]
                free = math.inf
                if self.capacity:
                    free = self.capacity - len(self._items)
            if not entries or free <= 0:
                return
            chosen = persistence.choose(entries, skips, free, self.length)
            chunks = self._files.read(chosen)
            with self._lock:
                self._known.update(e['uuid'] for e in chosen)
                chunks = self._compatible(chunks)
                self._add_loaded(chunks, skips)

    def _compatible(self, chunks):
        """Registers the loaded columns; skips chunks that contradict them."""
        kept = []
        for chunk in chunks:
            columns = {
                k: (v.dtype, v.shape[1:]) for k, v in chunk.data.items()}
            problems = []
            for key, column in columns.items():
                problem = self._column_problem(key, *column)
                if problem:
                    problems.append(f"'{key}' {problem}")
            if problems:
                print(f"Replay '{self.name}': skipping chunk file "
                      f"{chunk.filename}: {'; '.join(problems)}.", flush=True)
                continue
            for key, column in columns.items():
                self._check_column(key, *column)
            kept.append(chunk)
        return kept

    def _add_loaded(self, chunks, skips):
        uuids = {c.uuid for c in chunks}
        for chunk in chunks:
            if chunk.succ not in uuids:
                chunk.succ = None  # The stream continued in a chunk not loaded.
        ends = persistence.item_ends([
            {'uuid': c.uuid, 'succ': c.succ, 'length': c.length, 'time': c.time}
            for c in chunks], self.length)
        firsts = {
            c.uuid: min(skips.get(c.uuid, 0), ends[c.uuid]) for c in chunks}
        for chunk in chunks:
            self._chunks[chunk.uuid] = chunk
            self._refs[chunk.uuid] = ends[chunk.uuid] - firsts[chunk.uuid]
            if firsts[chunk.uuid]:
                self._first_live[chunk.uuid] = firsts[chunk.uuid]
        for chunk in chunks:
            if chunk.succ:
                self._refs[chunk.succ] += 1
        # Oldest first, so that reaching capacity evicts the oldest items.
        for chunk in sorted(chunks, key=lambda c: c.time):
            for index in range(firsts[chunk.uuid], ends[chunk.uuid]):
                self._insert(chunk.uuid, index)
        for chunk in chunks:
            if self._refs.get(chunk.uuid) == 0:
                self._refs[chunk.uuid] = 1
                self._release(chunk.uuid)

    def close(self):
        """Ends waits in `sample()` with `limiters.Released` and finishes the
        writes of earlier saves."""
        self._released.set()
        self._files.close()


def add_rows(replay, data, envids):
    """Adds row i of `data` as a step of env `envids[i]`, in one call when
    the replay has `add_batch` (a replay of the caller's own may not)."""
    if hasattr(replay, 'add_batch'):
        return replay.add_batch(data, envids)
    for i, envid in enumerate(envids):
        replay.add({k: v[i] for k, v in data.items()}, envid)


def _fits(out, spec, batch, length):
    """Whether `out` has an array of the right dtype and shape for every key
    of `spec` (keys beyond `spec` are left alone)."""
    for key, (dtype, shape) in spec.items():
        array = out.get(key)
        if (not isinstance(array, np.ndarray) or array.dtype != dtype or
                array.shape != (batch, length, *shape)):
            return False
    return True


def _assemble(draws, spec, length, out=None):
    data = {} if out is None else out
    if out is None:
        for key, (dtype, shape) in spec.items():
            data[key] = np.empty((len(draws), length, *shape), dtype)
    done = _assemble_packed(draws, spec, length, data)
    for key in spec:
        if key in done:
            continue
        array = data[key]
        for b, segments in enumerate(draws):
            t = 0
            for chunk, start, count in segments:
                column = chunk.data.get(key)
                if column is None:
                    array[b, t:t + count] = 0
                else:
                    array[b, t:t + count] = column[start:start + count]
                t += count
    return data


def _assemble_packed(draws, spec, length, data):
    """Copies the packed small columns (see `chunk.Packing`) into `data`
    when every chunk of the draws shares one packing: one copy per sequence
    piece for all of them, then one per column. Returns the keys done."""
    segments = [segment for segments in draws for segment in segments]
    packing = segments[0][0].packing
    if packing is None or any(c.packing is not packing for c, _, _ in segments):
        return ()
    rows = np.empty((len(draws) * length, packing.rowbytes), np.uint8)
    position = 0
    for chunk, start, count in segments:
        rows[position:position + count] = chunk.packed[start:start + count]
        position += count
    done = []
    for key, (dtype, shape, offset, nbytes) in packing.fields.items():
        if spec.get(key) == (dtype, shape):
            data[key][...] = rows[:, offset:offset + nbytes].view(
                dtype).reshape(len(draws), length, *shape)
            done.append(key)
    return done


def _mark_boundaries(data):
    if 'is_first' in data:
        first = data['is_first']
        if 'is_last' in data:
            # A stream abandoned mid-episode continues with a new episode:
            # mark the step before it as last.
            before = data['is_last'][:, :-1]
            np.logical_or(before, first[:, 1:], out=before)
        first[:, 0] = True
    return data


def _prepare_step(step, name):
    if not hasattr(step, 'items'):
        raise TypeError(
            f"Replay '{name}'.add expects a dict of arrays, got "
            f"{type(step).__name__}.")
    prepared = {}
    for key, value in step.items():
        if not isinstance(key, str):
            raise TypeError(
                f"Replay '{name}': step keys must be strings, got {key!r}.")
        if key.startswith('log/'):
            continue
        if key == 'stepid':
            raise ValueError(
                f"Replay '{name}': 'stepid' is set by the replay and may "
                f"not be part of an added step.")
        value = np.asarray(value)
        if value.dtype == object:
            raise ValueError(
                f"Replay '{name}': key '{key}' has dtype object; store "
                f"numbers, bools or fixed-width strings.")
        prepared[key] = value
    return prepared


def _worker_key(worker):
    if isinstance(worker, np.ndarray) and worker.ndim == 0:
        worker = worker.item()
    elif isinstance(worker, np.generic):
        worker = worker.item()
    try:
        hash(worker)
    except TypeError:
        raise TypeError(
            f'Replay worker must be hashable (e.g. an int), got '
            f'{type(worker).__name__}.') from None
    return worker


def _is_int(value):
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, np.integer)):
        return True
    return isinstance(value, float) and value.is_integer()


class Sampler:
    """`replay.sample(batch, mode)`, bound: calling it samples a batch,
    `sample_into(views)` samples one into given arrays (views of a
    shared-memory slot, say) and `layout()` tells their keys, dtypes and
    shapes (`Replay.layout`)."""

    def __init__(self, replay, batch, mode='train'):
        self.replay, self.batch, self.mode = replay, batch, mode

    def __call__(self):
        return self.replay.sample(self.batch, self.mode)

    def sample_into(self, views):
        """The next batch in `views` (returned), or in new arrays when
        `views` does not match `layout()`."""
        return self.replay.sample(self.batch, self.mode, out=views)

    def layout(self):
        return self.replay.layout(self.batch)
