import os
import threading

import elements
import numpy as np
import pytest

import embodied
import helpers
from embodied.core import selectors
from embodied.core.replay import Replay


def step(t, worker=0, **extra):
    return {'t': np.int32(t), 'worker': np.int32(worker),
            'image': np.full((2, 2), t % 256, np.uint8), **extra}


def fill(replay, steps, workers=1, start=0):
    for t in range(start, start + steps):
        for w in range(workers):
            replay.add(step(t, w), worker=w)


def contents(replay):
    """The (worker, first t) of every item, found by sampling densely."""
    batch = replay.sample(40 * len(replay) + 40, 'report')
    return set(zip(batch['worker'][:, 0].tolist(), batch['t'][:, 0].tolist()))


def assert_consecutive(batch, length):
    for t, w in zip(batch['t'], batch['worker']):
        assert (w == w[0]).all(), w
        assert (t - t[0] == np.arange(length)).all(), t


def chunk_files(directory):
    return sorted(x for x in os.listdir(directory) if x.endswith('.npz'))


def test_sample_has_keys_and_shapes():
    replay = Replay(length=5, capacity=10)
    for t in range(8):
        replay.add({**step(t), 'log/fps': 3.0, 'is_first': t == 0,
                    'is_last': False})
    batch = replay.sample(3)
    assert set(batch) == {
        't', 'worker', 'image', 'is_first', 'is_last', 'stepid'}
    assert batch['stepid'].shape == (3, 5, 20)
    assert batch['stepid'].dtype == np.uint8
    assert batch['image'].shape == (3, 5, 2, 2)
    assert batch['is_first'][:, 0].all()
    assert not batch['is_first'][:, 1:].any()


@pytest.mark.parametrize('length,workers,capacity', [
    (1, 1, 1), (2, 1, 2), (5, 1, 10), (1, 2, 2), (5, 3, 15), (2, 7, 20)])
def test_capacity_counts_items_and_evicts_oldest(length, workers, capacity):
    replay = Replay(length, capacity, chunksize=4)
    for t in range(30):
        for w in range(workers):
            replay.add(step(t, w), w)
        assert len(replay) == min(workers * max(0, t + 2 - length), capacity)
    # The items left are the newest, in the order they were completed.
    order = [(w, t) for t in range(31 - length) for w in range(workers)]
    assert contents(replay) == set(order[-capacity:])


def test_chunks_are_freed_when_no_item_needs_them():
    replay = Replay(length=4, capacity=10, chunksize=5)
    fill(replay, 500, workers=2)
    stats = replay.stats()
    assert stats['items'] == 10
    # Per worker: ~5 items + 3 steps of tail fit in 2-3 chunks, plus the
    # chunk being filled.
    assert stats['chunks'] <= 2 * 4
    assert stats['inserts'] == 2 * (500 - 3)


@pytest.mark.parametrize('length,chunksize', [(7, 3), (4, 64), (10, 1)])
def test_sequences_never_cross_workers(length, chunksize):
    rng = np.random.default_rng(0)
    replay = Replay(length, capacity=50, chunksize=chunksize, seed=1)
    counters = [0, 0, 0]
    for _ in range(200):
        worker = int(rng.integers(3))
        replay.add(step(counters[worker], worker), worker=worker)
        counters[worker] += 1
    batch = replay.sample(64)
    assert_consecutive(batch, length)
    assert len(set(batch['worker'][:, 0].tolist())) == 3


def test_uniform_sampling_covers_items_evenly():
    replay = Replay(length=5, capacity=20, seed=0)
    fill(replay, 7)
    batch = replay.sample(3000)
    _, counts = np.unique(batch['t'][:, 0], return_counts=True)
    assert len(counts) == 3 and counts.min() > 900


def test_worker_ids_from_arrays_are_accepted():
    replay = Replay(length=2, capacity=10)
    for t in range(3):
        replay.add(step(t), worker=np.array(7))
        replay.add(step(t, 1), worker=np.int64(8))
    assert replay.stats()['workers'] == 2 and len(replay) == 4


def test_add_batch_equals_adding_each_row():
    one, many = Replay(3, 50, chunksize=4), Replay(3, 50, chunksize=4)
    counts = [0, 0, 0]  # Each worker's own time steps.
    for t in range(12):
        workers = [0, 1, 2] if t % 2 else [2, 0]
        rows = []
        for w in workers:
            rows.append(step(counts[w], w))
            counts[w] += 1
            one.add(rows[-1], worker=w)
        many.add_batch(
            {k: np.stack([r[k] for r in rows]) for k in rows[0]},
            np.asarray(workers))
    assert len(one) == len(many) > 0
    assert contents(one) == contents(many)
    batch = many.sample(20)
    assert_consecutive(batch, 3)
    assert batch['image'].dtype == np.uint8


def test_add_batch_checks_rows_and_columns():
    replay = Replay(2, 10)
    replay.add(step(0))
    with pytest.raises(ValueError, match="'t' has shape"):
        replay.add_batch({'t': np.zeros(3, np.int32)}, [0, 1])
    bad = {'t': np.zeros(2, np.float32), 'worker': np.zeros(2, np.int32),
           'image': np.zeros((2, 2, 2), np.uint8)}
    with pytest.raises(ValueError, match="key 't'"):
        replay.add_batch(bad, [0, 1])
    assert replay.stats()['inserts'] == 0  # Nothing half-added.


def test_bad_steps_are_rejected_with_the_key():
    replay = Replay(length=2)
    replay.add(step(0))
    with pytest.raises(ValueError, match=r"missing \['image'\]"):
        replay.add({'t': np.int32(1), 'worker': np.int32(0)})
    with pytest.raises(ValueError, match="'image'.*shape"):
        replay.add({**step(1), 'image': np.zeros((3, 3), np.uint8)})
    with pytest.raises(ValueError, match='stepid'):
        replay.add({**step(1), 'stepid': np.zeros(20, np.uint8)})
    with pytest.raises(ValueError, match='length'):
        Replay(length=0)
    with pytest.raises(ValueError, match='mode'):
        replay.sample(1, 'test')


def test_update_writes_context_back():
    replay = Replay(length=4, capacity=30, chunksize=3)
    fill(replay, 20, workers=2)
    batch = replay.sample(6)
    deter = batch['t'].astype(np.float32)[..., None] * np.ones(3, np.float32)
    replay.update({'stepid': batch['stepid'], 'deter': deter,
                   't': batch['t'] + 1000})
    updated = {tuple(row) for row in batch['stepid'].reshape(-1, 20).tolist()}
    later = replay.sample(300)
    assert later['deter'].shape == (300, 4, 3)
    assert later['deter'].dtype == np.float32
    for ids, d, t in zip(later['stepid'].reshape(-1, 20).tolist(),
                         later['deter'].reshape(-1, 3), later['t'].reshape(-1)):
        if tuple(ids) in updated:
            assert t >= 1000 and (d == t - 1000).all()
        else:
            assert t < 1000 and (d == 0).all()
    assert replay.stats()['updates'] == 6 * 4


def test_update_ignores_evicted_steps_and_checks_shapes():
    replay = Replay(length=2, capacity=2, chunksize=2)
    fill(replay, 3)
    old = replay.sample(4)
    fill(replay, 10, start=3)  # Evicts everything sampled above.
    replay.update({'stepid': old['stepid'], 'deter': np.ones((4, 2, 1))})
    assert (replay.sample(8)['deter'] == 0).all()
    with pytest.raises(ValueError, match="'deter'"):
        replay.update({'stepid': old['stepid'], 'deter': np.ones((4, 3, 1))})
    with pytest.raises(KeyError, match='stepid'):
        replay.update({'deter': np.ones((4, 2, 1))})


def test_priority_updates_reach_the_selector():
    selector = selectors.Prioritized(seed=0)
    replay = Replay(length=2, capacity=10, selector=selector)
    fill(replay, 6)
    batch = replay.sample(5)
    favourite = batch['t'][0, 0]
    priority = np.where(batch['t'] == favourite, 1.0, 0.0)
    # Zero everything else, keep the favourite's two steps at one.
    everything = replay.sample(200)
    replay.update({'stepid': everything['stepid'],
                   'priority': np.zeros(everything['t'].shape)})
    replay.update({'stepid': batch['stepid'], 'priority': priority})
    later = replay.sample(100)
    starts = set(later['t'][:, 0].tolist())
    # Only items that contain a step of the favourite item keep weight.
    assert favourite in starts
    assert starts <= {favourite - 1, favourite}


def test_mixture_selector_as_built_by_make_replay():
    # The selector main.make_replay builds, with the default prio settings.
    capacity = 40
    fracs = elements.Config(uniform=0.5, priority=0.3, recency=0.2)
    selector = selectors.Mixture(dict(
        uniform=selectors.Uniform(),
        priority=selectors.Prioritized(
            exponent=0.8, maxfrac=0.5, initial=np.inf, zero_on_sample=True),
        recency=selectors.Recency(1.0 / np.arange(1, capacity + 1)),
    ), fracs)
    replay = Replay(length=5, capacity=capacity, chunksize=8, selector=selector)
    for t in range(60):
        for w in range(3):
            replay.add(step(t, w), worker=w)
        if t >= 10 and t % 5 == 0:
            batch = replay.sample(4)
            assert_consecutive(batch, 5)
            priority = np.abs(np.sin(batch['t'])).astype(np.float32)
            replay.update({'stepid': batch['stepid'], 'priority': priority})
    assert len(replay) == capacity and len(selector) == capacity
    assert_consecutive(replay.sample(64), 5)


def test_online_queue_serves_fresh_sequences_first():
    replay = Replay(length=3, capacity=100, online=True)
    fill(replay, 12)
    batch = replay.sample(4)
    assert batch['t'][:, 0].tolist() == [0, 3, 6, 9]
    assert replay.sample(4, 'report')['t'].shape == (4, 3)


def test_sampling_an_empty_replay_waits_for_data():
    replay = Replay(length=3)
    result = []
    thread = threading.Thread(target=lambda: result.append(replay.sample(2)))
    thread.start()
    fill(replay, 3)
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert result[0]['t'].tolist() == [[0, 1, 2], [0, 1, 2]]


def test_close_releases_a_waiting_sampler():
    replay = Replay(length=3)
    error = helpers.released_error(lambda: replay.sample(1), replay.close)
    assert 'empty' in str(error)


def test_save_then_load_restores_the_same_items(tmp_path):
    replay = Replay(length=4, capacity=25, chunksize=5, directory=tmp_path,
                    save_wait=True)
    fill(replay, 30, workers=3)
    batch = replay.sample(4)
    replay.update({'stepid': batch['stepid'], 'deter': np.ones((4, 4, 2))})
    data = replay.save()
    assert isinstance(data, dict)

    restored = Replay(length=4, capacity=25, chunksize=5, directory=tmp_path)
    restored.load(data)
    assert len(restored) == len(replay) == 25
    assert contents(restored) == contents(replay)
    sample = restored.sample(200)
    assert_consecutive(sample, 4)
    assert sample['deter'].shape == (200, 4, 2) and sample['deter'].any()
    # The restored replay keeps going with new data.
    fill(restored, 10, workers=3, start=30)
    assert len(restored) == 25
    assert_consecutive(restored.sample(100), 4)


def test_load_with_checkpoint_data_restores_only_items_held_then(tmp_path):
    replay = Replay(length=3, capacity=10, chunksize=4, directory=tmp_path,
                    save_wait=True)
    fill(replay, 20, workers=2)
    replay.save()  # These files stay on disk after their items are evicted.
    fill(replay, 20, workers=2, start=20)
    data = replay.save()
    fill(replay, 5, workers=2, start=40)  # After the checkpoint.
    replay.save()

    exact = Replay(length=3, capacity=100, chunksize=4, directory=tmp_path)
    exact.load(data)
    held = {(w, t) for t in range(33, 38) for w in range(2)}
    # Items completed after the checkpoint, some starting in older chunks.
    later = {(w, t) for t in range(38, 43) for w in range(2)}
    assert contents(exact) == held | later
    everything = Replay(length=3, capacity=100, chunksize=4, directory=tmp_path)
    everything.load()
    assert len(everything) > len(exact)


def test_load_reads_newest_chunks_up_to_capacity(tmp_path):
    replay = Replay(length=3, capacity=None, chunksize=4, directory=tmp_path,
                    save_wait=True)
    fill(replay, 40)
    replay.save()
    small = Replay(length=3, capacity=10, chunksize=4, directory=tmp_path)
    small.load()
    assert len(small) == 10
    assert contents(small) == {(0, t) for t in range(28, 38)}
    assert small.stats()['chunks'] <= 4


def test_loading_twice_does_not_duplicate(tmp_path):
    replay = Replay(length=3, capacity=None, chunksize=4, directory=tmp_path,
                    save_wait=True)
    fill(replay, 20, workers=2)
    replay.save()
    replay.load()  # Its own files: nothing new.
    assert len(replay) == 2 * 18
    restored = Replay(length=3, capacity=None, chunksize=4, directory=tmp_path)
    restored.load()
    restored.load()
    assert len(restored) == len(replay)
    assert contents(restored) == contents(replay)


def test_saving_again_writes_only_new_chunks(tmp_path):
    replay = Replay(length=3, capacity=100, chunksize=10, directory=tmp_path,
                    save_wait=True)
    fill(replay, 15)  # One full chunk and one in progress.
    replay.save()
    first = chunk_files(tmp_path)
    assert len(first) == 2
    fill(replay, 12, start=15)  # Continues the stream in new chunks.
    replay.save()
    second = chunk_files(tmp_path)
    assert set(first) < set(second)
    assert sum(int(x.split('-')[-1][:-4]) for x in second) == 27
    replay.save()  # Nothing new: nothing written.
    assert chunk_files(tmp_path) == second

    restored = Replay(length=3, capacity=100, chunksize=10, directory=tmp_path)
    restored.load()
    # Sequences run across the chunk boundaries that the saves introduced.
    assert contents(restored) == {(0, t) for t in range(25)}
    assert len(restored) == 25


def test_truncated_or_stray_files_do_not_break_load(tmp_path, capsys):
    replay = Replay(length=2, capacity=None, chunksize=5, directory=tmp_path,
                    save_wait=True)
    fill(replay, 20)
    replay.save()
    files = chunk_files(tmp_path)
    assert len(files) == 4
    broken = tmp_path / files[1]
    content = broken.read_bytes()
    broken.write_bytes(content[:len(content) // 2])
    stray = tmp_path / (files[0] + '.tmp-1234abcd')  # A crash mid-write.
    stray.write_bytes(b'partial')
    old = os.path.getmtime(stray) - 3600
    os.utime(stray, (old, old))
    young = tmp_path / (files[0] + '.tmp-5678abcd')  # A write in progress.
    young.write_bytes(b'partial')
    (tmp_path / 'notes.txt').write_text('not a chunk')

    restored = Replay(length=2, capacity=None, chunksize=5, directory=tmp_path)
    restored.load()
    assert files[1] in capsys.readouterr().out
    assert not stray.exists() and young.exists()
    assert (tmp_path / 'notes.txt').exists()
    # Chunk 0 lost its successor, so its last step starts no item.
    expected = {(0, t) for t in range(4)} | {(0, t) for t in range(10, 19)}
    assert contents(restored) == expected
    assert_consecutive(restored.sample(100), 2)


def test_concurrent_add_sample_update_save(tmp_path):
    replay = Replay(length=4, capacity=60, chunksize=8, directory=tmp_path)
    errors = []

    def adder(worker):
        try:
            for t in range(300):
                replay.add(step(t, worker), worker)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    def learner():
        try:
            for _ in range(60):
                batch = replay.sample(8)
                assert_consecutive(batch, 4)
                replay.update({'stepid': batch['stepid'],
                               'deter': np.ones((8, 4), np.float32)})
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=adder, args=(w,)) for w in range(3)]
    threads.append(threading.Thread(target=learner))
    for thread in threads:
        thread.start()
    for _ in range(3):
        replay.save()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    replay.save()
    replay.close()
    restored = Replay(length=4, capacity=60, chunksize=8, directory=tmp_path)
    restored.load()
    assert len(restored) == 60
    assert_consecutive(restored.sample(50), 4)


def test_estimate_bytes_counts_steps_and_stepids():
    spaces = {
        'image': elements.Space(np.uint8, (64, 64, 3)),
        'reward': elements.Space(np.float32),
        'log/fps': elements.Space(np.float32),
    }
    per_step = 64 * 64 * 3 + 4 + 20
    estimate = Replay.estimate_bytes(spaces, capacity=1000, length=10,
                                     chunksize=16, workers=2)
    assert estimate == per_step * (1000 + 2 * (9 + 32))
    replay = Replay(length=10, capacity=1000, chunksize=16)
    for t in range(1200):
        replay.add({'image': np.zeros((64, 64, 3), np.uint8),
                    'reward': np.float32(0)}, worker=t % 2)
    assert replay.stats()['ram_bytes'] <= estimate
    with pytest.raises(ValueError, match='capacity'):
        Replay.estimate_bytes(spaces, capacity=None, length=10)


def test_replay_module_exposes_selectors():
    assert embodied.replay.selectors.Mixture is selectors.Mixture
    assert embodied.replay.Replay is Replay


def test_checkpoint_restores_replay(tmp_path):
    replay = Replay(length=3, capacity=12, chunksize=4,
                    directory=tmp_path / 'replay', save_wait=True)
    fill(replay, 20, workers=2)
    checkpoint = embodied.Checkpoint(tmp_path / 'ckpt')
    checkpoint.replay = replay
    checkpoint.save()

    restored = Replay(length=3, capacity=12, chunksize=4,
                      directory=tmp_path / 'replay')
    checkpoint = embodied.Checkpoint(tmp_path / 'ckpt')
    checkpoint.replay = restored
    checkpoint.load()
    assert contents(restored) == contents(replay)


def _rich_step(t, worker):
    return {'t': np.int32(t), 'worker': np.int32(worker),
            'vector': np.arange(5, dtype=np.float32) + t,
            'flag': np.bool_(t % 3 == 0), 'token': np.int64(t * 7),
            'image': np.full((16, 16, 3), t % 256, np.uint8)}


def _filled_replay(seed):
    replay = Replay(length=5, capacity=60, chunksize=7,
                    selector=selectors.Uniform(seed))
    for t in range(40):
        replay.add_batch(
            {k: np.stack([_rich_step(t, w)[k] for w in range(3)])
             for k in _rich_step(0, 0)}, [0, 1, 2])
    return replay


def test_small_columns_are_packed_and_sample_as_separate_ones(monkeypatch):
    from embodied.core import chunk as chunklib
    replay = _filled_replay(seed=3)
    chunk = next(iter(replay._chunks.values()))
    assert chunk.packing and 'image' not in chunk.packing.fields
    for key in ('stepid', 't', 'worker', 'vector', 'flag', 'token'):
        assert np.shares_memory(chunk.data[key], chunk.packed), key
    packed = replay.sample(50)
    layout = replay.layout(50)
    out = {k: np.full(shape, 1, dtype) for k, dtype, shape in layout}
    into = replay.sample(50, out=out)
    assert into is out

    monkeypatch.setattr(chunklib, 'PACK_BYTES', 0)  # No column is small.
    chunklib.packing.cache_clear()
    try:
        plain = _filled_replay(seed=3)
        assert next(iter(plain._chunks.values())).packing is None
        unpacked = plain.sample(50)
        again = plain.sample(50)
    finally:
        chunklib.packing.cache_clear()
    assert packed.keys() == unpacked.keys()
    for key in packed:
        assert packed[key].dtype == unpacked[key].dtype, key
        # Chunk uuids are random: of step ids, compare the row indices.
        part = slice(16, None) if key == 'stepid' else slice(None)
        np.testing.assert_array_equal(
            packed[key][..., part], unpacked[key][..., part], key)
        np.testing.assert_array_equal(
            into[key][..., part], again[key][..., part], key)
    held = {c.uuid for c in replay._chunks.values()}
    assert {bytes(i) for i in packed['stepid'][..., :16].reshape(
        -1, 16)} <= held
    assert_consecutive(packed, 5)
    assert (packed['vector'][..., 0] == packed['t']).all()
    assert (packed['token'] == 7 * packed['t']).all()


def test_packed_columns_survive_trim_update_save_and_load(tmp_path):
    replay = Replay(length=3, capacity=40, chunksize=8, directory=tmp_path,
                    save_wait=True)
    for t in range(13):
        replay.add(_rich_step(t, 0), worker=0)
    data = replay.save()  # Closes the chunk in progress: it is trimmed.
    trimmed = [c for c in replay._chunks.values() if c.length == 5]
    assert trimmed and trimmed[0].packing and len(trimmed[0].packed) == 5
    batch = replay.sample(30)
    replay.update({'stepid': batch['stepid'], 't': batch['t'] + 1000,
                   'deter': np.ones((30, 3, 2), np.float32)})
    later = replay.sample(300)
    assert ((later['t'] >= 1000) == later['deter'][..., 0].astype(bool)).all()
    restored = Replay(length=3, capacity=40, chunksize=8, directory=tmp_path)
    restored.load(data)
    for t in range(13, 30):  # New packed chunks beside the loaded ones.
        restored.add(_rich_step(t, 0), worker=0)
    mixed = restored.sample(400)
    assert_consecutive(mixed, 3)
    assert (mixed['vector'][..., 0] == mixed['t']).all()
    assert mixed['t'].max() >= 13 and mixed['t'].min() < 13
