"""Replay -> learner on its own: a consumer and a producer in one process,
the calls between them plain function calls."""

import numpy as np
import pytest
from portal import futures

from embodied.rpc import replay_to_learner

pytestmark = pytest.mark.timeout(60)


def batch(value, rows=2):
    return {'x': np.full((rows, 3), value, np.float32),
            'n': np.full((rows,), value, np.int64)}


def layout_of(rows=2):
    return (('x', '<f4', (rows, 3)), ('n', '<i8', (rows,)))


class Link:
    """The producer behind the consumer's `call`, answered at once."""

    def __init__(self, producer, make, layout=None, make_into=None):
        self.producer, self.args = producer, (make, layout, make_into)
        self.targets = []

    def __call__(self, target=None):
        self.targets.append(target)
        future = futures.Future()
        future.set_result(self.producer.answer(target, *self.args))
        return future


def roundtrip(consumer, requests):
    """(first value, rows, whether x matches n) of each batch received; the
    batches themselves are dropped, so that their slots are free again."""
    got = []
    for _ in range(requests):
        pending = consumer.request()
        got += [(int(b['n'][0]), len(b['n']), bool(
            (b['x'] == b['n'][:, None]).all()))
            for b in consumer.receive(pending, pending.future.result())]
    return got


def test_batches_come_through_slots_made_in_place_after_the_first():
    producer = replay_to_learner.Producer()
    values = iter(range(100))
    made_into = []

    def make_into(views):
        made_into.append(views)
        value = next(values)
        views['x'].fill(value)
        views['n'].fill(value)
        return views
    link = Link(producer, lambda: batch(next(values)), layout_of, make_into)
    shared = []
    consumer = replay_to_learner.Consumer(
        link, 'Test: batches', shared=True, prefetch=1, per_request=2,
        on_shared=lambda: shared.append(1))
    try:
        got = roundtrip(consumer, 3)
        assert got == [(value, 2, True) for value in range(5)]
        assert link.targets[0] is None and link.targets[1] is not None
        assert len(made_into) == 4 and len(shared) == 4
    finally:
        consumer.close()
        producer.close()


def test_a_producer_without_layout_copies_and_a_changed_layout_falls_back():
    producer = replay_to_learner.Producer()
    sizes = iter([2, 2, 2, 3, 3])
    values = iter(range(100))
    link = Link(producer, lambda: batch(next(values), next(sizes)))
    consumer = replay_to_learner.Consumer(
        link, 'Test: batches', shared=True, prefetch=1, per_request=1)
    try:
        got = roundtrip(consumer, 5)
        assert got == [(value, rows, True) for value, rows in enumerate(
            [2, 2, 2, 3, 3])]
        # The batch of another layout came back itself; a new ring took it.
        assert consumer.ring is not None and consumer.ring.layout == (
            replay_to_learner.layout_of(batch(0, 3)))
    finally:
        consumer.close()
        producer.close()


def test_none_from_the_producer_ends_the_consumer_and_frees_its_slots():
    producer = replay_to_learner.Producer()
    answers = iter([batch(0), None])
    link = Link(producer, lambda: next(answers))
    consumer = replay_to_learner.Consumer(
        link, 'Test: batches', True, prefetch=1,
                                per_request=2)
    try:
        assert len(roundtrip(consumer, 1)) == 1
        pending = consumer.request()
        assert pending.slots and consumer.receive(
            pending, pending.future.result()) is None
        assert consumer.ring.acquire() is not None  # Freed again.
    finally:
        consumer.close()
        producer.close()


def test_batches_per_request_keep_the_slot_ring_small():
    debug_batch = 1_196_160  # 8 x 12 steps of the dummy env's obs.
    per_request = replay_to_learner.batches_per_request(
        debug_batch, prefetch=4)
    assert 1 < per_request <= replay_to_learner.MAX_PER_REQUEST
    assert (per_request + 1) * 4 * debug_batch <= replay_to_learner.RING_BYTES
    assert replay_to_learner.batches_per_request(1000, prefetch=4) == (
        replay_to_learner.MAX_PER_REQUEST)
    # A 16 x 64 batch of 64x64x3 images: one per request, 8 slots.
    assert replay_to_learner.batches_per_request(
        16 * 64 * 12288, prefetch=4) == 1


def test_batch_stream_prefetches_from_the_start_and_ends_on_none():
    producer = replay_to_learner.Producer()
    answers = iter([batch(0), batch(1), batch(2), None, None, None])
    link = Link(producer, lambda: next(answers))
    consumer = replay_to_learner.Consumer(
        link, 'Test: batches', False, prefetch=3)
    waited = []
    stream = replay_to_learner.BatchStream(
        consumer, lambda future: waited.append(1) or future.result())
    try:
        assert len(link.targets) == 3  # Asked ahead, before any `next`.
        assert stream.ready_soon()
        assert [int(b['n'][0]) for b in stream] == [0, 1, 2]
        assert len(waited) == 4  # The fourth reply was None: the end.
    finally:
        stream.close()
        producer.close()
