"""The replay process's role in-process: no sockets, no subprocesses."""

import threading
import time

import elements
import helpers
import numpy as np
import pytest

import embodied
from embodied import rpc
from embodied.main import make_stream
from embodied.run import arguments
from embodied.run.parallel.replay import ReplayRole

BATCH, LENGTH = 2, 4

pytestmark = pytest.mark.timeout(60)


def wait_until(condition, timeout=30):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, 'condition not reached'
        time.sleep(0.005)


def make_role(train_ratio=8, stream=None, **kwargs):
    args = arguments.with_defaults(dict(
        logdir='/tmp/unused', batch_size=BATCH, batch_length=LENGTH,
        train_ratio=train_ratio, wait_report=60, **kwargs))
    stream = stream or (lambda replay, mode: embodied.streams.Stateless(
        replay.sampler(BATCH, mode)))
    return ReplayRole(embodied.replay.Replay(LENGTH, 10_000),
                      embodied.replay.Replay(LENGTH, 10_000), stream, args)


def rows(envids, t, is_eval=()):
    """One step of each env in `envids`, as the actor sends it: `value`
    encodes env and time step."""
    envids = np.asarray(envids, np.int64)
    n = len(envids)
    return {
        'envid': envids,
        'is_eval': np.isin(envids, list(is_eval)),
        'value': (envids * 1000 + t).astype(np.int64),
        'reward': np.zeros(n, np.float32),
        'is_first': np.full(n, t == 0), 'is_last': np.zeros(n, bool),
        'is_terminal': np.zeros(n, bool),
    }


def check_sequences(batch, envids):
    """Each sequence is consecutive steps of one env of `envids`."""
    value = batch['value']
    assert value.shape == (BATCH, LENGTH)
    for seq in value:
        assert set((seq // 1000).tolist()) <= set(envids), seq
        assert len(set((seq // 1000).tolist())) == 1, seq
        assert (np.diff(seq) == 1).all(), seq


def test_eval_rows_go_to_the_eval_replay_and_train_rows_through_the_limiter():
    role = make_role()
    try:
        for t in range(6):  # Fewer train inserts than the limiter's minsize.
            role.add_batch(rows([0, 1, 2], t, is_eval=[2]))
        status = role.status()
        assert status['inserts'] == 12 and status['eval_inserts'] == 6
        assert len(role.replay_eval) == 6 - LENGTH + 1
        assert len(role.replay_train) == 2 * (6 - LENGTH + 1)
        check_sequences(role.sample_batch_eval(), [2])
        check_sequences(role.sample_batch_report(), [0, 1])
    finally:
        role.close()


# 0 and, as in the original, a negative train ratio: no limit past minsize,
# so sampling never waits.
@pytest.mark.parametrize('train_ratio', [0, -1])
def test_train_batches_hold_consecutive_steps_of_one_env(train_ratio):
    role = make_role(train_ratio=train_ratio)
    try:
        for t in range(60):
            role.add_batch(rows([0, 1], t))
        for _ in range(20):
            check_sequences(role.sample_batch_train(), [0, 1])
        assert role.status()['samples'] == 20 * BATCH
    finally:
        role.close()


def main_stream(replay, mode):
    """`embodied.main.make_stream`'s stream, as the runner builds it."""
    config = elements.Config(
        batch_size=BATCH, batch_length=LENGTH, report_length=LENGTH,
        consec_train=1, consec_report=1, replay_context=0)
    return make_stream(config, replay, mode)


def slot_role():
    args = arguments.with_defaults(dict(
        logdir='/tmp/unused', batch_size=BATCH, batch_length=LENGTH,
        train_ratio=0, wait_report=60))
    role = ReplayRole(
        embodied.replay.Replay(LENGTH, 10_000),
        embodied.replay.Replay(LENGTH, 10_000), main_stream, args)
    for t in range(60):
        role.add_batch(rows([0, 1], t))
    return role


def test_slot_batches_are_sampled_straight_into_the_slot(monkeypatch):
    role = slot_role()
    ring = None
    try:
        first = role.sample_batch_train()  # The learner's first batch.
        assert sorted(first) == sorted(
            ['value', 'reward', 'is_first', 'is_last', 'is_terminal',
             'stepid', 'consec'])
        ring, problem = rpc.replay_to_learner.SlotRing.create(
            rpc.replay_to_learner.layout_of(first), 4)
        assert problem is None, problem
        copies = []
        monkeypatch.setattr(
            rpc.replay_to_learner.np, 'copyto',
            lambda *a, **k: copies.append(a))
        for _ in range(10):
            slots = [ring.acquire(), ring.acquire()]
            replies = role.sample_batch_train(ring.target(slots))
            assert replies == [  # Slot numbers, not the batches.
                rpc.replay_to_learner.slot_reply(slot) for slot in slots]
            for slot in slots:
                batch = ring.read(slot)
                check_sequences(batch, [0, 1])
                assert (batch['consec'] == 0).all()
                assert batch['is_first'][:, 0].all()
                stepids = {bytes(row) for row in batch['stepid'][:, 0]}
                assert len(stepids) == BATCH or BATCH == 1
                del batch
        assert not copies  # Written in place, not copied after sampling.
        assert role.status()['samples'] == 21 * BATCH
    finally:
        role.close()
        ring and ring.close()


def test_slot_batches_of_a_grown_spec_are_sent_as_batches():
    role = slot_role()
    ring = None
    try:
        ring, problem = rpc.replay_to_learner.SlotRing.create(
            rpc.replay_to_learner.layout_of(role.sample_batch_train()), 2)
        assert problem is None, problem
        batch = role.sample_batch_train()
        role.update({'stepid': batch['stepid'],  # A key the slots lack.
                     'extra': np.ones((BATCH, LENGTH), np.float32)})
        slot = ring.acquire()
        reply, = role.sample_batch_train(ring.target([slot]))
        sent = reply[rpc.replay_to_learner.BATCH]
        assert 'extra' in sent
        check_sequences(sent, [0, 1])
    finally:
        role.close()
        ring and ring.close()


def own_stream(replay, mode):
    """A user's own stream: a generator, without `layout` or `next_into`."""
    while True:
        yield replay.sample(BATCH, mode)


def test_other_streams_are_sampled_then_copied():
    role = make_role(train_ratio=0, stream=own_stream)
    ring = None
    try:
        for t in range(60):
            role.add_batch(rows([0, 1], t))
        assert embodied.streams.layout(role.stream_train) is None
        ring, problem = rpc.replay_to_learner.SlotRing.create(
            rpc.replay_to_learner.layout_of(role.sample_batch_train()), 2)
        assert problem is None, problem
        slot = ring.acquire()
        assert role.sample_batch_train(ring.target([slot])) == [
            rpc.replay_to_learner.slot_reply(slot)]
        check_sequences(ring.read(slot), [0, 1])
    finally:
        role.close()
        ring and ring.close()


def blocked_inserts(role, steps=100):
    """A thread that adds `steps` steps of env 0 one request each, started
    and returned once the limiter holds it back."""
    thread = threading.Thread(target=lambda: [
        role.add_batch(rows([0], t)) for t in range(steps)], daemon=True)
    thread.start()
    wait_until(lambda: not role.limiter.want_insert() and role.status(
        ).get('inserts') == role.limiter.size)
    return thread


def test_inserts_wait_for_samples_past_minsize_and_tolerance():
    role = make_role(train_ratio=LENGTH)  # One sampled step per insert.
    thread = blocked_inserts(role)
    try:
        thread.join(0.2)
        assert thread.is_alive()  # Blocked in add_batch.
        inserted = role.status()['inserts']
        assert inserted == role.limiter.minsize + 4 * BATCH - 1, inserted
        # Each batch of samples lets BATCH more inserts in.
        role.sample_batch_train()
        wait_until(lambda: role.status()['inserts'] == inserted + BATCH)
    finally:
        role.release()
        thread.join(10)
        role.close()
    assert not thread.is_alive()


def test_a_waiting_insert_goes_on_in_groups_of_half_the_tolerance():
    role = make_role(train_ratio=LENGTH)  # One sampled step per insert.
    group = role.insert_group
    assert group == 4 * BATCH // 2
    n = 300
    steps = {
        'envid': np.zeros(n, np.int64), 'is_eval': np.zeros(n, bool),
        'value': np.arange(n, dtype=np.int64),
        'reward': np.zeros(n, np.float32), 'is_first': np.arange(n) == 0,
        'is_last': np.zeros(n, bool), 'is_terminal': np.zeros(n, bool)}
    first = {k: v[:role.limiter.minsize] for k, v in steps.items()}
    rest = {k: v[role.limiter.minsize:] for k, v in steps.items()}
    role.add_batch(first)  # Under minsize: no wait, and the replay has items.
    thread = threading.Thread(
        target=lambda: role.add_batch(rest), daemon=True)
    thread.start()
    try:
        wait_until(lambda: not role.limiter.want_insert() and role.status(
            ).get('inserts') == role.limiter.size)
        inserted = role.status()['inserts']
        # One batch makes room for BATCH rows, fewer than the group: the
        # insert keeps waiting. The next makes room for the whole group.
        role.sample_batch_train()
        thread.join(0.2)
        assert role.status()['inserts'] == inserted
        role.sample_batch_train()
        wait_until(lambda: role.status()['inserts'] == inserted + group)
        thread.join(0.2)
        assert role.status()['inserts'] == inserted + group
    finally:
        role.release()
        thread.join(10)
        role.close()
    assert not thread.is_alive()
    assert role.status()['inserts'] == n  # Released: the rest went in.
    batch = role.sample_batch_report()
    assert (np.diff(batch['value'], axis=1) == 1).all()


@pytest.mark.parametrize('train_ratio', [4, 32])
def test_limiter_holds_the_train_ratio(train_ratio):
    """Inserter and sampler run freely in two threads; the limiter makes
    sampled steps per inserted step (past minsize) the train ratio."""
    role = make_role(train_ratio=train_ratio)
    batches = []

    def sample():
        while (batch := role.sample_batch_train()) is not None:
            batches.append(batch)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        for t in range(400):
            role.add_batch(rows([0, 1], t))
        wait_until(lambda: not role.limiter.want_sample())  # Drained.
    finally:
        role.release()
        sampler.join(10)
        role.close()
    assert not sampler.is_alive()
    status = role.status()
    assert status['inserts'] == 800
    after_minsize = status['inserts_after_minsize']
    ratio = len(batches) * BATCH * LENGTH / after_minsize
    # The sampler may run ahead by the tolerance (4 * batch_size samples),
    # the insert that reaches minsize already earns credit, and a batch it
    # began when the limit came is not counted.
    slack = (4 * BATCH + train_ratio / LENGTH + BATCH) * LENGTH / after_minsize
    assert abs(ratio - train_ratio) <= slack, (ratio, train_ratio)
    assert status['train_ratio'] == pytest.approx(ratio)
    for batch in batches[::10]:
        check_sequences(batch, [0, 1])


def test_a_drain_lets_waiting_inserts_in_and_the_limiter_counts_them():
    role = make_role(train_ratio=LENGTH)  # One sampled step per insert.
    thread = blocked_inserts(role)
    later = None
    try:
        thread.join(0.2)
        assert thread.is_alive()  # The limiter holds the inserts back.
        role.drain(True)  # A save drains: the rows on their way go in.
        thread.join(10)
        assert not thread.is_alive()
        assert role.status()['inserts'] == role.limiter.size == 100
        role.drain(False)  # After the save the limiter holds again.
        later = threading.Thread(
            target=role.add_batch, args=(rows([0], 100),), daemon=True)
        later.start()
        later.join(0.2)
        assert later.is_alive()
        assert role.status()['inserts'] == 100
    finally:
        role.release()
        for each in (thread, later):
            each and each.join(10)
        role.close()
    assert not later.is_alive()


def test_release_ends_a_waiting_sample_with_none():
    role = make_role()
    result = []
    thread = threading.Thread(
        target=lambda: result.append(role.sample_batch_train()), daemon=True)
    thread.start()
    thread.join(0.2)
    assert thread.is_alive()  # Nothing inserted: the limiter holds it.
    role.release()
    thread.join(10)
    assert not thread.is_alive() and result == [None]
    role.close()


def test_released_inserts_skip_the_limiter():
    role = make_role()
    role.release()
    for t in range(100):  # Far past minsize and tolerance, no sampler.
        role.add_batch(rows([0], t))
    assert role.status()['inserts'] == 100
    role.close()


def test_save_under_the_lock(tmp_path):
    role = make_role()
    role.checkpoint = helpers.LockedCheckpoint(
        role.lock, elements.Path(tmp_path))
    assert role.save(7.0) == 7 and role.checkpoint.saved == [7]
    role.close()
