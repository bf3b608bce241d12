import functools
import threading
import time
import traceback

import numpy as np
import pytest

import embodied
from embodied.core import streams


def wait_until(condition, timeout=5):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, 'condition not met in time'
        time.sleep(0.001)


class Counter(embodied.Stream):
    """Batches of shape [batch, length] whose `step` field counts on."""

    def __init__(self, batch=2, length=4, name=0):
        self.batch = batch
        self.length = length
        self.name = name
        self.count = 0

    def __next__(self):
        start = self.count * self.length
        steps = np.arange(start, start + self.length)
        self.count += 1
        return {
            'step': np.tile(steps, (self.batch, 1)),
            'is_first': np.zeros((self.batch, self.length), bool),
            'source': np.full((self.batch, self.length), self.name),
        }

    def save(self):
        return {'count': self.count}

    def load(self, data):
        self.count = data['count']


class TestStateless:

    def test_calls_function_with_arguments(self):
        calls = []
        stream = streams.Stateless(
            lambda a, b: calls.append((a, b)) or len(calls), 1, b=2)
        assert [next(stream) for _ in range(3)] == [1, 2, 3]
        assert calls == [(1, 2)] * 3
        assert stream.save() is None
        stream.load(None)

    def test_accepts_iterator(self):
        stream = streams.Stateless(iter([5, 6]))
        assert next(stream) == 5
        assert next(iter(stream)) == 6

    def test_rejects_non_callable(self):
        with pytest.raises(TypeError, match='callable or an iterator'):
            streams.Stateless(42)


class TestConsec:

    def test_chunks_with_prefix_overlap(self):
        source = Counter(batch=2, length=3 * 3 + 2)
        stream = streams.Consec(source, length=3, consec=3, prefix=2)
        chunks = [next(stream) for _ in range(6)]
        for i, chunk in enumerate(chunks[:3]):
            assert chunk['step'].shape == (2, 5)
            assert (chunk['step'][0] == np.arange(5) + 3 * i).all()
            assert (chunk['consec'] == i).all()
            assert chunk['consec'].dtype == np.int32
            assert chunk['consec'].shape == (2, 5)
        # The prefix of each chunk repeats the end of the previous one.
        assert (chunks[1]['step'][:, :2] == chunks[0]['step'][:, -2:]).all()
        # The fourth chunk starts the next source batch.
        assert (chunks[3]['step'][0] == np.arange(11, 16)).all()
        assert (chunks[3]['consec'] == 0).all()
        assert source.count == 2

    def test_no_prefix_tiles_the_batch(self):
        stream = streams.Consec(Counter(length=8), length=4, consec=2)
        steps = np.concatenate(
            [next(stream)['step'] for _ in range(2)], axis=1)
        assert (steps[0] == np.arange(8)).all()

    def test_strict_rejects_wrong_length(self):
        stream = streams.Consec(Counter(length=9), length=4, consec=2)
        with pytest.raises(ValueError, match=r'= 8 steps, got 9'):
            next(stream)

    def test_not_strict_drops_extra_steps(self):
        stream = streams.Consec(
            Counter(length=9), length=4, consec=2, strict=False)
        assert (next(stream)['step'][0] == np.arange(4)).all()
        assert (next(stream)['step'][0] == np.arange(4, 8)).all()
        assert (next(stream)['step'][0] == np.arange(9, 13)).all()

    def test_not_strict_rejects_too_short(self):
        stream = streams.Consec(
            Counter(length=7), length=4, consec=2, strict=False)
        with pytest.raises(ValueError, match='at least .* = 8 steps, got 7'):
            next(stream)

    def test_contiguous(self):
        stream = streams.Consec(
            Counter(length=8), length=2, consec=4, contiguous=True)
        next(stream)
        chunk = next(stream)
        assert all(v.flags['C_CONTIGUOUS'] for v in chunk.values())
        plain = streams.Consec(Counter(length=8), length=2, consec=4)
        assert not next(plain)['step'].flags['C_CONTIGUOUS']

    def test_bad_arguments(self):
        with pytest.raises(ValueError, match='length must be an integer'):
            streams.Consec(Counter(), length=0, consec=1)
        with pytest.raises(ValueError, match='prefix'):
            streams.Consec(Counter(), length=1, consec=1, prefix=-1)

    def test_save_load_mid_batch_continues(self):
        def make():
            return streams.Consec(
                Counter(length=3 * 2 + 1), length=2, consec=3, prefix=1)
        stream = make()
        [next(stream) for _ in range(4)]  # One batch and one chunk more.
        state = stream.save()
        expected = [next(stream) for _ in range(4)]
        restored = make()
        restored.load(state)
        for want in expected:
            got = restored.__next__()
            assert (got['step'] == want['step']).all()
            assert (got['consec'] == want['consec']).all()


class TestPrefetch:

    def test_yields_in_order_and_transforms(self):
        stream = streams.Prefetch(
            Counter(length=2), lambda b: {**b, 'double': b['step'] * 2}, 3)
        for i in range(5):
            batch = next(stream)
            assert (batch['step'][0] == [2 * i, 2 * i + 1]).all()
            assert (batch['double'] == batch['step'] * 2).all()
        stream.close()

    def test_computes_amount_ahead(self):
        source = Counter(length=1)
        stream = streams.Prefetch(source, amount=2)
        next(stream)
        wait_until(lambda: source.count == 3)  # One taken, two ahead.
        time.sleep(0.05)  # Give it the chance to overrun.
        assert source.count == 3
        stream.close()

    def test_error_keeps_type_and_traceback(self):
        class Broken(Exception):
            pass

        def failing_source():
            yield 1
            raise Broken('source broke')

        stream = streams.Prefetch(failing_source())
        assert next(stream) == 1
        with pytest.raises(Broken, match='source broke') as info:
            next(stream)
        frames = traceback.format_tb(info.value.__traceback__)
        assert any('failing_source' in frame for frame in frames)
        # Asking again repeats the same error instead of hanging.
        with pytest.raises(Broken) as again:
            next(stream)
        assert again.value is info.value
        stream.close()

    def test_error_in_transform(self):
        def transform(x):
            raise KeyError('bad key')
        stream = streams.Prefetch(iter(range(3)), transform)
        with pytest.raises(KeyError, match='bad key'):
            next(stream)

    def test_end_of_source(self):
        stream = streams.Prefetch(iter([1, 2]), amount=4)
        assert list(stream) == [1, 2]

    def test_close_while_source_blocks(self):
        release = threading.Event()

        def blocking():
            yield 1
            release.wait()
            yield 2

        stream = streams.Prefetch(blocking())
        assert next(stream) == 1
        stream.close(timeout=0.1)  # Returns though the source still blocks.
        release.set()
        with pytest.raises(RuntimeError, match='after close'):
            next(stream)

    def test_save_load(self):
        stream = streams.Prefetch(Counter(length=1), amount=2)
        [next(stream) for _ in range(3)]
        state = stream.save()
        assert state == {'count': 3}  # Not counting prefetched batches.
        want = [next(stream)['step'][0, 0] for _ in range(3)]
        assert want == [3, 4, 5]
        stream.load(state)
        assert [next(stream)['step'][0, 0] for _ in range(3)] == want
        restored = streams.Prefetch(Counter(length=1))
        restored.load(state)
        assert next(restored)['step'][0, 0] == 3
        stream.close()
        restored.close()


class TestZip:

    def test_concatenates_batches(self):
        stream = streams.Zip([Counter(2, 3, name=0), Counter(1, 3, name=1)])
        batch = next(stream)
        assert batch['step'].shape == (3, 3)
        assert list(batch['source'][:, 0]) == [0, 0, 1]

    def test_save_load(self):
        def make():
            return streams.Zip([Counter(name=0), Counter(name=1)])
        stream = make()
        next(stream)
        state = stream.save()
        want = next(stream)
        restored = make()
        restored.load(state)
        assert (next(restored)['step'] == want['step']).all()
        with pytest.raises(ValueError, match='state has 1 sources'):
            restored.load(state[:1])

    def test_key_mismatch(self):
        class Other(Counter):
            def __next__(self):
                return {'other': np.zeros((1, 4))}
        stream = streams.Zip([Counter(), Other()])
        with pytest.raises(ValueError, match=r"source 1 has keys \['other'"):
            next(stream)


class TestMap:

    def test_applies_function_and_passes_state(self):
        source = Counter(length=1)
        stream = streams.Map(source, lambda b, k: b['step'] + k, k=100)
        assert next(stream)[0, 0] == 100
        assert stream.save() == {'count': 1}
        stream.load({'count': 7})
        assert next(stream)[0, 0] == 107


class TestMixer:

    def test_proportions(self):
        sources = {'a': Counter(1, 1, 'a'), 'b': Counter(1, 1, 'b')}
        stream = streams.Mixer(sources, {'a': 3, 'b': 1}, seed=0)
        picks = [next(stream)['source'][0, 0] for _ in range(2000)]
        share = np.mean(np.array(picks) == 'a')
        assert 0.72 < share < 0.78
        assert sources['a'].count + sources['b'].count == 2000

    def test_zero_weight_never_picked(self):
        sources = {'a': Counter(1, 1, 'a'), 'b': Counter(1, 1, 'b')}
        stream = streams.Mixer(sources, {'a': 1, 'b': 0})
        assert {next(stream)['source'][0, 0] for _ in range(50)} == {'a'}

    def test_save_load_continues_picks(self):
        def make():
            sources = {'a': Counter(1, 1, 'a'), 'b': Counter(1, 1, 'b')}
            return streams.Mixer(sources, {'a': 1, 'b': 1}, seed=3)
        stream = make()
        [next(stream) for _ in range(10)]
        state = stream.save()
        want = [next(stream) for _ in range(20)]
        restored = make()
        restored.load(state)
        for batch in want:
            got = next(restored)
            assert got['source'][0, 0] == batch['source'][0, 0]
            assert got['step'][0, 0] == batch['step'][0, 0]

    def test_bad_weights(self):
        with pytest.raises(ValueError, match='same keys'):
            streams.Mixer({'a': Counter()}, {'b': 1})
        with pytest.raises(ValueError, match='non-negative'):
            streams.Mixer({'a': Counter()}, {'a': -1})


def filled_replay(length=5, steps=40):
    replay = embodied.replay.Replay(length, 1000)
    for t in range(steps):
        replay.add({'value': np.float32(t), 'is_first': t == 0}, worker=0)
    return replay


def views_of(layout):
    return {key: np.zeros(shape, dtype) for key, dtype, shape in layout}


def test_consec_over_replay_sampler_makes_batches_in_given_arrays(monkeypatch):
    replay = filled_replay()
    stream = streams.Consec(
        streams.Stateless(replay.sampler(3, 'train')), length=4, consec=1,
        prefix=1, contiguous=True)
    layout = stream.layout()
    assert layout[-1] == ('consec', '<i4', (3, 5))
    assert dict((k, s) for k, _, s in layout)['value'] == (3, 5)
    out = views_of(layout)
    out['consec'].fill(7)
    copies = []
    monkeypatch.setattr(np, 'copyto', lambda *a, **k: copies.append(a))
    batch = stream.next_into(out)
    assert batch is out and not copies  # Made in place, no copy after.
    assert (out['consec'] == 0).all()
    assert (np.diff(out['value'], axis=1) == 1).all()
    assert stream.layout() is layout  # The same while the keys are.


def test_streams_that_cannot_fill_in_place_make_then_copy():
    replay = filled_replay()
    cut = streams.Consec(  # Two chunks per source batch.
        streams.Stateless(replay.sampler(2, 'train')), length=2, consec=2,
        prefix=1)
    assert cut.layout() is None
    own = streams.Stateless(lambda: replay.sample(2, 'train'))
    assert own.layout() is None
    # The original's make_stream binds `replay.sample`: a plain callable.
    bound = streams.Stateless(functools.partial(replay.sample, 2, 'train'))
    assert bound.layout() is None
    generator = (replay.sample(2, 'train') for _ in iter(int, 1))
    assert streams.layout(generator) is None
    for stream in (own, bound, generator):
        first = next(stream)
        out = {k: np.zeros_like(v) for k, v in first.items()}
        assert streams.next_into(stream, out) is out
        assert (np.diff(out['value'], axis=1) == 1).all()
    out = {'value': np.zeros((2, 3), np.float64)}  # Another dtype.
    assert streams.next_into(own, out) is not out


def test_consec_with_a_cut_in_progress_or_grown_keys_falls_back():
    replay = filled_replay()
    stream = streams.Consec(
        streams.Stateless(replay.sampler(2, 'train')), length=5, consec=1)
    out = views_of(stream.layout())
    replay.update({'stepid': next(stream)['stepid'],
                   'extra': np.ones((2, 5), np.float32)})
    batch = stream.next_into(out)  # The replay's keys grew: cut as usual.
    assert batch is not out and 'extra' in batch
    assert (batch['consec'] == 0).all()
    stream.pending = {k: v for k, v in batch.items() if k != 'consec'}
    assert stream.layout() is None  # A restored position being cut.
