"""The coalescing sender on its own: items held while the peer is busy go
on joined, a full hold makes `put` wait, closing ends a wait."""

import threading

import numpy as np
import pytest
from portal import futures

from embodied.rpc.actor_to_replay import CoalescingSender, concat_rows

pytestmark = pytest.mark.timeout(60)


class Peer:
    """Records each send; its futures resolve when told."""

    def __init__(self):
        self.sent, self.pending = [], []

    def send(self, item):
        self.sent.append(item)
        future = futures.Future()
        self.pending.append(future)
        return [future]

    def answer(self):
        for future in self.pending:
            if not future.done():
                future.set_result(None)


def make(peer, hold=4, backlog=8):
    return CoalescingSender(
        peer.send, lambda held: [sum(held, [])], len, hold, backlog)


def test_items_held_while_the_peer_is_busy_go_on_joined_in_order():
    peer = Peer()
    sender = make(peer)
    for item in ([0], [1], [2]):
        sender.put(item)
    assert peer.sent == [[0]]  # The first at once; the others are held.
    assert not sender.flush(force=False)  # Still busy: still held.
    peer.answer()
    assert sender.flush(force=False)
    assert peer.sent == [[0], [1, 2]]
    peer.answer()
    assert sender.settle()


def test_a_full_hold_waits_for_the_peer_and_closing_ends_the_wait():
    peer = Peer()
    sender = make(peer, hold=2)
    sender.put([0])
    sender.put([1])  # Held: one unit.
    waiting = threading.Thread(target=sender.put, args=([2],), daemon=True)
    waiting.start()
    waiting.join(0.3)
    assert waiting.is_alive() and len(peer.sent) == 1  # Two units held.
    peer.answer()
    waiting.join(10)
    assert not waiting.is_alive() and peer.sent[1] == [1, 2]
    sender.put([3])
    sender.closing.set()  # The peer is busy; a full hold gives up.
    with pytest.raises(RuntimeError, match='shut down'):
        sender.put([4])


def test_flush_counts_arrived_sends_as_gone_and_errors_surface():
    peer = Peer()
    sender = make(peer, backlog=2)
    sender.put([0])
    sender.put([1])  # Held.
    peer.answer()
    sender.inflight.extend([peer.pending[0]] * 2)  # Arrived, not settled.
    assert sender.flush()
    assert peer.sent[-1] == [1]
    peer.pending[-1].set_error(ValueError('bad key'))
    with pytest.raises(ValueError, match='bad key'):
        sender.settle()


def test_concat_rows_joins_items_of_the_same_keys_only():
    one = ({'x': np.zeros(2), 'y': np.ones(2)}, {'z': np.arange(2)})
    two = ({'x': np.ones(1), 'y': np.ones(1)}, {'z': np.arange(1)})
    joined, = concat_rows([one, two])
    assert joined[0]['x'].tolist() == [0, 0, 1]
    assert joined[1]['z'].tolist() == [0, 1, 0]
    other = ({'x': np.ones(1)}, {'z': np.arange(1)})
    assert concat_rows([one, other]) == [one, other]  # Kept apart.
    assert concat_rows([one]) == [one]
