"""Old replay chunk files are deleted once no kept checkpoint needs them."""

import numpy as np

from embodied.core import checkpoint as cplib
from embodied.core import replay as replaylib
from embodied.run.parallel import replay_files


def make_replay(directory):
    return replaylib.Replay(
        length=2, capacity=20, chunksize=4, directory=directory,
        save_wait=True)


def add(replay, start, count):
    for i in range(start, start + count):
        replay.add({'count': np.int32(i)}, worker=0)


def test_prune_keeps_what_kept_saves_need(tmp_path):
    replay = make_replay(tmp_path / 'replay')
    cp = cplib.Checkpoint(tmp_path / 'ckpt', keep=2)
    cp.replay = replay
    files = lambda: sorted((tmp_path / 'replay').glob('*.npz'))
    counts = []
    for tag in range(1, 9):
        add(replay, 10 * tag, 10)
        cp.save(tag)
        counts.append(len(files()))
        replay_files.prune(replay.directory, cp.directory, 'replay')
    # Capacity 20 and two kept saves: the files stop growing.
    assert len(files()) < counts[-1]
    assert len(files()) <= 20 // 4 * 2 + 4

    # Both kept saves still load completely, the older one too.
    for tag in cp.tags():
        fresh = make_replay(tmp_path / 'replay')
        cp2 = cplib.Checkpoint(tmp_path / 'ckpt')
        cp2.replay = fresh
        cp2.load(tag)
        assert len(fresh) == 20
        batch = fresh.sample(8, 'train')
        assert (np.diff(batch['count'], axis=1) == 1).all()


def test_prune_keeps_everything_without_readable_saves(tmp_path):
    replay = make_replay(tmp_path / 'replay')
    add(replay, 0, 30)
    replay.save()
    before = len(list((tmp_path / 'replay').glob('*.npz')))
    assert replay_files.prune(replay.directory, tmp_path / 'none', 'replay') == 0
    (tmp_path / 'ckpt' / '000000000001').mkdir(parents=True)
    (tmp_path / 'ckpt' / '000000000001' / 'done').write_bytes(b'')
    assert replay_files.prune(replay.directory, tmp_path / 'ckpt', 'replay') == 0
    assert len(list((tmp_path / 'replay').glob('*.npz'))) == before


def test_prune_reads_the_new_index_and_a_pickle_one_only_when_trusted(
        tmp_path):
    # After an upgrade (run.trust_pickle once), the oldest kept save is
    # a pickle of an earlier version: without trust nothing is deleted,
    # with it the files that no kept save needs go, as before.
    import pickle
    import shutil
    replay = make_replay(tmp_path / 'replay')
    cp = cplib.Checkpoint(tmp_path / 'ckpt', keep=None)
    cp.replay = replay
    files = lambda: sorted((tmp_path / 'replay').glob('*.npz'))
    for tag in (1, 2, 3):
        add(replay, 40 * tag, 40)
        cp.save(tag)
    # Save 1 pruned by save_keep: the files it held that save 2 no longer
    # holds are needed by no kept save, which only save 2's index tells.
    shutil.rmtree(tmp_path / 'ckpt' / f'{1:012d}')
    old = tmp_path / 'ckpt' / f'{2:012d}'
    data = cplib.read_entry(old, 'replay')
    for name in ('replay.json', 'done'):
        (old / name).unlink()
    (old / 'replay.pkl').write_bytes(pickle.dumps(data))
    (old / 'done').write_bytes(b'')
    before = len(files())
    assert replay_files.prune(replay.directory, cp.directory, 'replay') == 0
    assert len(files()) == before
    removed = replay_files.prune(
        replay.directory, cp.directory, 'replay', trust_pickle=True)
    assert removed > 0 and len(files()) == before - removed
    shutil.rmtree(old)  # Once no pickle save is kept, no key is needed.
    assert replay_files.prune(replay.directory, cp.directory, 'replay') > 0
