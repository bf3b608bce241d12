"""The shared-memory slots of replay -> learner
(`rpc.replay_to_learner`): `SlotRing` and `SlotWriter`."""

import errno
import gc
import os
import subprocess
import sys

import numpy as np
import pytest

from embodied.rpc import replay_to_learner as slots

pytestmark = pytest.mark.skipif(
    not os.path.isdir(slots.SHM_DIR), reason=f'no {slots.SHM_DIR}')


def batch(seed=0, size=2):
    rng = np.random.default_rng(seed)
    return {
        'image': rng.integers(0, 255, (size, 3, 8, 8, 3), np.uint8),
        'reward': rng.standard_normal((size, 3)).astype(np.float32),
        'is_first': rng.integers(0, 2, (size, 3)).astype(bool),
        'stepid': rng.integers(0, 255, (size, 3, 20), np.uint8),
    }


@pytest.fixture
def ring():
    ring, problem = slots.SlotRing.create(slots.layout_of(batch()), 3)
    assert problem is None, problem
    yield ring
    ring.close()


def one(ring, slot):
    """The one-slot target the server writes a batch for."""
    return slots.split(ring.target([slot]))[0]


def ours():
    return {f for f in os.listdir(slots.SHM_DIR) if f.startswith(slots.PREFIX)}


def test_batches_arrive_intact_in_every_slot(ring):
    writer = slots.SlotWriter()
    kept = []
    for seed in range(3):
        slot = ring.acquire()
        reply = writer.write(one(ring, slot), batch(seed))
        assert reply == slots.slot_reply(slot)
        kept.append(ring.read(slot))
    for seed, got in enumerate(kept):
        want = batch(seed)
        assert got.keys() == want.keys()
        for key in want:
            assert got[key].dtype == want[key].dtype
            np.testing.assert_array_equal(got[key], want[key])
            assert got[key].ctypes.data % 64 == 0  # XLA may alias it.
    writer.close()


def test_slot_is_reused_only_after_its_last_array_is_gone(ring):
    writer = slots.SlotWriter()
    slot = ring.acquire()
    writer.write(one(ring, slot), batch(1))
    data = ring.read(slot)
    part = data['image'][1:, 2]  # A view outlives the batch dict.
    del data
    gc.collect()
    others = [ring.acquire(), ring.acquire()]
    assert ring.acquire() is None, 'a slot in use was handed out again'
    del part
    gc.collect()
    assert ring.acquire() == slot
    for other in others:
        ring.release(other)
    writer.close()


def test_server_falls_back_to_sending_the_batch(ring, tmp_path):
    writer = slots.SlotWriter()
    data = batch()
    slot = ring.acquire()
    path, index, signature = one(ring, slot)
    changed = {**data, 'extra': np.zeros((2, 3), np.float32)}
    outside = tmp_path / (slots.PREFIX + 'x')
    outside.write_bytes(bytes(1 << 20))
    cases = {
        'no target': None,
        'layout changed': [path, index, 'other'],
        'slot out of range': [path, 99, signature],
        'negative slot': [path, -1, signature],
        'malformed': 'garbage',
        'missing file': [path + 'gone', index, signature],
        'wrong prefix': [os.path.join(slots.SHM_DIR, 'victim'), index,
                         signature],
        'outside /dev/shm': [str(outside), index, signature],
        'traversal': [os.path.join(slots.SHM_DIR, '..', 'tmp', 'x'), index,
                      signature],
    }
    for case, target in cases.items():
        assert writer.write(target, data)[slots.BATCH] is data, case
    assert writer.write(one(ring, slot), changed)[slots.BATCH] is changed
    assert outside.read_bytes() == bytes(1 << 20)
    writer.close()


def test_file_is_unlinked_once_mapped_and_nothing_is_left(ring):
    writer = slots.SlotWriter()
    assert os.path.basename(ring.path) in ours()
    slot = ring.acquire()
    writer.write(one(ring, slot), batch(0))
    ring.unlink()
    assert os.path.basename(ring.path) not in ours()
    # The server keeps its mapping, so later batches still arrive.
    data = ring.read(slot)
    other = ring.acquire()
    assert writer.write(one(ring, other), batch(5)) == slots.slot_reply(
        other)
    np.testing.assert_array_equal(ring.read(other)['reward'],
                                  batch(5)['reward'])
    ring.close()
    # Batches read before the close keep their memory and content.
    np.testing.assert_array_equal(data['image'], batch(0)['image'])
    writer.close()


def test_files_of_dead_processes_are_removed():
    dead = subprocess.run(
        [sys.executable, '-c', 'import os; print(os.getpid())'],
        capture_output=True, text=True, check=True).stdout.strip()
    stale = os.path.join(slots.SHM_DIR, f'{slots.PREFIX}{dead}-x')
    alive = os.path.join(slots.SHM_DIR, f'{slots.PREFIX}{os.getpid()}-keep')
    for path in (stale, alive):
        open(path, 'wb').close()
    try:
        ring, _ = slots.SlotRing.create(slots.layout_of(batch()), 1)
        ring.close()
        assert not os.path.exists(stale)
        assert os.path.exists(alive)
    finally:
        for path in (stale, alive):
            if os.path.exists(path):
                os.unlink(path)


def test_no_room_in_shared_memory_means_no_ring(monkeypatch):
    before = ours()

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, 'No space left on device')

    monkeypatch.setattr(os, 'posix_fallocate', full)
    ring, problem = slots.SlotRing.create(slots.layout_of(batch()), 4)
    assert ring is None and 'No space left' in problem
    assert ours() == before  # The half-made file is gone.


def test_a_request_names_several_slots(ring):
    writer = slots.SlotWriter()
    wanted = [ring.acquire(), ring.acquire()]
    targets = slots.split(ring.target(wanted))
    replies = [writer.write(t, batch(i)) for i, t in enumerate(targets)]
    assert replies == [slots.slot_reply(slot) for slot in wanted]
    for i, slot in enumerate(wanted):
        np.testing.assert_array_equal(
            ring.read(slot)['image'], batch(i)['image'])
    assert slots.split('garbage') == ['garbage']
    writer.close()


def test_missing_directory_or_no_arrays_means_no_ring(tmp_path):
    ring, problem = slots.SlotRing.create(
        slots.layout_of(batch()), 2, str(tmp_path / 'absent'))
    assert ring is None and 'does not exist' in problem
    assert slots.layout_of({'a': [1, 2]}) is None
    assert slots.layout_of({}) is None
    assert slots.layout_of(None) is None
