"""Composable, checkpointable iterators of training batches.

A batch is a dict of arrays shaped `[batch, time, ...]`. Every stream has
`save() -> data` and `load(data)`; loading what `save()` returned makes the
stream continue from the same position.

    stream = Stateless(replay.sampler(batch_size, 'train'))
    stream = Consec(stream, length=64, consec=1, prefix=0)
    stream = Prefetch(stream, transform=agent_specific_fn, amount=2)
    batch = next(stream)

`stream.next_into(out)` writes the next batch into given arrays (views of a
shared-memory slot, say) and returns `out`. `Stateless` over a replay's
sampler (`replay.sampler(batch, mode)`, which has `sample_into(views)`) and
`Consec` over that, as `embodied.factories.make_stream` builds them, make the
batch there with one copy from the replay's chunks, and say so with
`stream.layout()`; every other stream (`layout()` None; the original's
`Stateless(bind(replay.sample, ...))` among them) makes the batch and then
copies it, and a stream of the caller's own without these methods goes
through `next_into(stream, out)` and `layout(stream)` below.
"""

import functools
import queue
import threading

import elements
import numpy as np

from . import base, checks


def layout(stream):
    """`stream.layout()`, or None for a stream without one."""
    method = getattr(stream, 'layout', None)
    return method() if method else None


def next_into(stream, out):
    """`stream.next_into(out)`; for a stream without it, the base class's
    fallback (the batch is made, then copied into `out` where it fits)."""
    method = getattr(stream, 'next_into', None)
    if method:
        return method(out)
    return base.fill(next(stream), out)


def _save(source):
    return source.save() if hasattr(source, 'save') else None


def _load(source, data):
    if hasattr(source, 'load'):
        source.load(data)


class Stateless(base.Stream):
    """Calls `nextfn(*args, **kwargs)` for every batch; nothing to save.

    `nextfn` may also be an iterator, whose `__next__` is then used.
    """

    def __init__(self, nextfn, *args, **kwargs):
        if not callable(nextfn) and hasattr(nextfn, '__next__'):
            nextfn = nextfn.__next__
        if not callable(nextfn):
            raise TypeError(
                f'Stateless needs a callable or an iterator, got '
                f'{type(nextfn).__name__}.')
        self.nextfn = functools.partial(nextfn, *args, **kwargs)
        # A replay's sampler (`Replay.sampler`) fills given arrays and tells
        # their layout.
        fills = not args and not kwargs and all(
            hasattr(nextfn, name) for name in ('sample_into', 'layout'))
        self._fills = nextfn if fills else None

    def __next__(self):
        return self.nextfn()

    def layout(self):
        return None if self._fills is None else self._fills.layout()

    def next_into(self, out):
        if self._fills is None:
            return super().next_into(out)
        return self._fills.sample_into(out)

    def save(self):
        return None

    def load(self, data):
        pass


class Consec(base.Stream):
    """Cuts each source batch into `consec` consecutive chunks along time.

    A source batch must span `consec * length + prefix` steps (at least that
    many when `strict=False`; extra steps at the end are dropped). Chunk `i`
    covers steps `[i * length, i * length + prefix + length)`, so its first
    `prefix` steps repeat the end of chunk `i - 1` as context:

        length=3, consec=3, prefix=2, source steps 0..10
        chunk 0:  0 1 | 2 3 4
        chunk 1:        3 4 | 5 6 7
        chunk 2:              6 7 | 8 9 10

    Every chunk gets a `consec` key (int32, `[batch, time]`) holding `i`.
    `contiguous=True` copies chunks into C-contiguous arrays, which costs a
    copy but speeds up sending them over the network.
    """

    def __init__(
            self, source, length, consec, prefix=0, strict=True,
            contiguous=False):
        checks.integers('Consec', 1, length=length, consec=consec)
        checks.integers('Consec', 0, prefix=prefix)
        self.source = source
        self.length = int(length)
        self.consec = int(consec)
        self.prefix = int(prefix)
        self.strict = strict
        self.contiguous = contiguous
        self.iterator = None
        self.index = 0  # The next chunk to cut from `self.pending`.
        self.pending = None  # The source batch being cut, if any.
        self._layout = (None, None)  # The source's layout and ours.

    @property
    def needed(self):
        """Time steps each source batch must provide."""
        return self.consec * self.length + self.prefix

    def __next__(self):
        if self.pending is None:
            if self.iterator is None:
                self.iterator = iter(self.source)
            self.pending = self._check(next(self.iterator))
            self.index = 0
        return self._cut()

    def layout(self):
        """The source's layout plus `consec` where one chunk is the whole
        source batch (consec 1, a source batch of exactly `needed` steps)
        and no cut is in progress (a restored position); else None."""
        if self.consec != 1 or self.pending is not None:
            return None
        inner = layout(self.source)
        if inner is None or not inner:
            return None
        if self._layout[0] is not inner:
            whole = all(
                len(shape) >= 2 and shape[1] == self.needed
                for _, _, shape in inner)
            batch = inner[0][2][0]
            self._layout = inner, inner + (
                ('consec', '<i4', (batch, self.needed)),) if whole else None
        return self._layout[1]

    def next_into(self, out):
        if self.layout() is None:
            return super().next_into(out)
        data = next_into(self.source, out)
        if data is out:
            out['consec'].fill(0)
            return out
        # The source could not use `out` (its keys grew): cut as usual.
        self.pending, self.index = self._check(data), 0
        return self._cut()

    def _cut(self):
        start = self.index * self.length
        stop = start + self.prefix + self.length
        chunk = {k: v[:, start:stop] for k, v in self.pending.items()}
        batch_size = len(next(iter(self.pending.values())))
        chunk['consec'] = np.full(
            (batch_size, stop - start), self.index, np.int32)
        if self.contiguous:
            chunk = {k: np.ascontiguousarray(v) for k, v in chunk.items()}
        self.index += 1
        if self.index == self.consec:
            self.pending, self.index = None, 0
        return chunk

    def save(self):
        # The batch being cut is part of the position: a sampled source
        # would not give it again.
        return {
            'source': _save(self.source),
            'index': self.index,
            'pending': self.pending,
        }

    def load(self, data):
        _load(self.source, data['source'])
        self.index = data['index']
        self.pending = data['pending']

    def _check(self, batch):
        if not isinstance(batch, dict) or not batch:
            raise TypeError(
                f'Consec: the source must give non-empty dicts of arrays, '
                f'got {type(batch).__name__}.')
        batch = {k: np.asarray(v) for k, v in batch.items()}
        if 'consec' in batch:
            raise ValueError(
                "Consec: the source batch already has a 'consec' key.")
        lengths = {}
        for key, value in batch.items():
            if value.ndim < 2:
                raise ValueError(
                    f"Consec: source key '{key}' has shape {value.shape}, "
                    f"expected [batch, time, ...].")
            lengths[key] = value.shape[1]
        available = min(lengths.values())
        if len(set(lengths.values())) > 1:
            raise ValueError(
                f'Consec: source keys differ in time length: {lengths}.')
        if self.strict and available != self.needed:
            raise ValueError(
                f'Consec: source batches must span consec * length + prefix '
                f'= {self.consec} * {self.length} + {self.prefix} = '
                f'{self.needed} steps, got {available}.')
        if available < self.needed:
            raise ValueError(
                f'Consec: source batches must span at least consec * length '
                f'+ prefix = {self.needed} steps, got {available}.')
        return batch


class Prefetch(base.Stream):
    """Computes up to `amount` batches ahead in a background thread.

    `source` is an iterable or a function that returns one. `transform` runs
    in the background thread too. An exception raised by the source or the
    transform is re-raised by `next()` as the same object, so its type and
    traceback survive. `close()` stops the thread without waiting for a
    source that blocks; the thread is a daemon and never keeps the process
    alive.
    """

    _END = object()

    def __init__(self, source, transform=None, amount=1):
        checks.integers('Prefetch', 1, amount=amount)
        if not hasattr(source, '__iter__') and callable(source):
            source = source()
        self.source = iter(source)
        self.transform = transform or (lambda x: x)
        self.amount = int(amount)
        self.state = _save(self.source)
        # The thread and its queues are made by the first next().
        self.results = self.slots = self.stop = self.worker = None
        self.error = None
        self.closed = False

    def __next__(self):
        if self.closed:
            raise RuntimeError('Prefetch: next() after close().')
        if self.error is not None:
            raise self.error
        if self.worker is None:
            self._start()
        item = self.results.get()
        self.slots.release()
        if item is self._END:
            self._halt()
            self.error = StopIteration()
            raise StopIteration
        if isinstance(item, BaseException):
            self._halt()
            self.error = item
            raise item
        data, self.state = item
        return data

    def save(self):
        """The source state right after the last batch `next()` returned."""
        return self.state

    def load(self, data):
        """Restores the source; drops batches computed ahead from before."""
        running = self.worker is not None
        if running:
            self._halt()
        _load(self.source, data)
        self.state = data
        self.error = None
        if running:
            self._start()

    def close(self, timeout=1.0):
        """Stops the worker; waits at most `timeout` seconds for it."""
        if self.closed:
            return
        self.closed = True
        if self.worker is not None:
            self._halt(timeout)

    def __del__(self):
        if getattr(self, 'stop', None) is not None:
            self.stop.set()

    def _start(self):
        self.results = queue.Queue()
        self.slots = threading.Semaphore(self.amount)
        self.stop = threading.Event()
        self.worker = threading.Thread(
            target=self._work, args=(self.results, self.slots, self.stop),
            name='Prefetch', daemon=True)
        self.worker.start()

    def _halt(self, timeout=None):
        self.stop.set()
        self.worker.join(timeout)
        self.worker = None

    def _work(self, results, slots, stop):
        while not stop.is_set():
            if not slots.acquire(timeout=0.1):
                continue
            try:
                item = (self.transform(next(self.source)), _save(self.source))
            except StopIteration:
                item = self._END
            except BaseException as e:
                item = e
            results.put(item)
            if not isinstance(item, tuple):
                return


class Zip(base.Stream):
    """Concatenates one batch of each source along the batch axis."""

    def __init__(self, sources):
        sources = list(sources)
        if not sources:
            raise ValueError('Zip: needs at least one source.')
        self.sources = sources
        self.iterators = None

    def __next__(self):
        if self.iterators is None:
            self.iterators = [iter(x) for x in self.sources]
        parts = [next(x) for x in self.iterators]
        keys = set(parts[0].keys())
        for index, part in enumerate(parts[1:], 1):
            if set(part.keys()) != keys:
                raise ValueError(
                    f'Zip: source {index} has keys {sorted(part.keys())} but '
                    f'source 0 has {sorted(keys)}.')
        return elements.tree.map(lambda *xs: np.concatenate(xs, 0), *parts)

    def save(self):
        return [_save(x) for x in self.sources]

    def load(self, data):
        if len(data) != len(self.sources):
            raise ValueError(
                f'Zip: the saved state has {len(data)} sources, this stream '
                f'has {len(self.sources)}.')
        for source, state in zip(self.sources, data):
            _load(source, state)


class Map(base.Stream):
    """Applies `fn(batch, *args, **kwargs)` to every batch of the source."""

    def __init__(self, source, fn, *args, **kwargs):
        self.source = source
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.iterator = None

    def __next__(self):
        if self.iterator is None:
            self.iterator = iter(self.source)
        return self.fn(next(self.iterator), *self.args, **self.kwargs)

    def save(self):
        return _save(self.source)

    def load(self, data):
        _load(self.source, data)


class Mixer(base.Stream):
    """Draws each batch from one source, picked at random by weight.

    The pick for the n-th batch depends only on `(seed, n)`, so a restored
    mixer continues with the same sequence of picks.
    """

    def __init__(self, sources, weights, seed=0):
        if set(sources) != set(weights):
            raise ValueError(
                f'Mixer: sources {sorted(sources)} and weights '
                f'{sorted(weights)} must have the same keys.')
        self.keys = sorted(sources)
        if not self.keys:
            raise ValueError('Mixer: needs at least one source.')
        probs = np.array([weights[k] for k in self.keys], np.float64)
        if not np.isfinite(probs).all() or (probs < 0).any() or (
                probs.sum() <= 0):
            raise ValueError(
                f'Mixer: weights must be finite, non-negative and not all '
                f'zero, got {dict(weights)}.')
        self.probs = probs / probs.sum()
        self.sources = [sources[k] for k in self.keys]
        self.iterators = None
        self.seed = seed
        self.step = 0

    def __next__(self):
        if self.iterators is None:
            self.iterators = [iter(x) for x in self.sources]
        rng = np.random.default_rng([self.seed, self.step])
        self.step += 1
        index = rng.choice(len(self.keys), p=self.probs)
        return next(self.iterators[index])

    def save(self):
        return {
            'seed': self.seed,
            'step': self.step,
            'sources': {k: _save(s) for k, s in zip(self.keys, self.sources)},
        }

    def load(self, data):
        if sorted(data['sources']) != self.keys:
            raise ValueError(
                f"Mixer: the saved state has sources "
                f"{sorted(data['sources'])}, this mixer has {self.keys}.")
        self.seed = data['seed']
        self.step = data['step']
        for key, source in zip(self.keys, self.sources):
            _load(source, data['sources'][key])
