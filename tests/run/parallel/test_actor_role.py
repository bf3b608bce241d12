"""The actor's role in-process: no sockets, no subprocesses."""

import threading

import elements
import numpy as np
import pytest
from portal import futures

from embodied.agents import testing
from embodied.run import arguments
from embodied.run.parallel.actor import ActorRole

pytestmark = pytest.mark.timeout(60)

OBS_SPACE = {
    'count': elements.Space(np.int64),
    'reward': elements.Space(np.float32),
    'is_first': elements.Space(bool),
    'is_last': elements.Space(bool),
    'is_terminal': elements.Space(bool),
}
ACT_SPACE = {'action': elements.Space(np.int32, (), 0, 2)}


class Client:
    """A role's client: records each call; its futures resolve when told
    (`hold`) or at once."""

    def __init__(self, hold=False):
        self.calls = []
        self.hold = hold
        self.pending = []

    def _call(self, name, data):
        self.calls.append((name, data))
        future = futures.Future()
        if self.hold:
            self.pending.append(future)
        else:
            future.set_result({})
        return future

    def add_batch(self, data):
        return self._call('add_batch', data)

    def tran(self, data):
        return self._call('tran', data)


def make_actor(replay=None, logger=None, hold_rows=None, **kwargs):
    args = arguments.with_defaults(
        dict(logdir='/tmp/unused', actor_batch=2, **kwargs))
    agent = testing.TestAgent(OBS_SPACE, ACT_SPACE, {})
    replay = replay or Client()
    logger = logger or Client()
    actor = ActorRole(agent, args, replay, logger, hold_rows=hold_rows)
    return actor, replay, logger


def obs(envids, counts, is_eval=(), **extra):
    envids = np.asarray(envids, np.int64)
    counts = np.asarray(counts, np.int64)
    return {
        'envid': envids, 'is_eval': np.isin(envids, list(is_eval)),
        'count': counts, 'reward': np.zeros(len(envids), np.float32),
        'is_first': counts == 0, 'is_last': np.zeros(len(envids), bool),
        'is_terminal': np.zeros(len(envids), bool), **extra,
    }


def test_act_keeps_one_carry_per_env_in_any_grouping():
    """The test agent raises when a carry does not continue its env's
    count; envs arrive in changing groups and orders."""
    actor, _, _ = make_actor()
    groups = [[0, 1, 2], [2, 0], [1], [1, 2, 0], [0], [2, 1]]
    counts = {0: 0, 1: 0, 2: 0}
    for group in groups:
        reply, _ = actor.act(obs(group, [counts[e] for e in group]))
        assert reply['action'].shape == (len(group),)
        assert not reply['reset'].any()
        for e in group:
            counts[e] += 1
    for e, count in counts.items():
        assert int(actor.carry(e)['count']) == count - 1
    assert actor.stats()['policy_steps'] == sum(counts.values())
    assert actor.stats()['carries'] == 3


def test_act_with_a_swapped_carry_fails():
    """The check above can fail: env 1 steps ahead of env 0, then the two
    swap ids."""
    actor, _, _ = make_actor()
    actor.act(obs([0, 1], [0, 5]))
    with pytest.raises(testing.DataCheckError, match='out of order'):
        actor.act(obs([0, 1], [6, 1]))


def test_transitions_go_to_replay_and_logger_after_the_reply():
    actor, replay, logger = make_actor()
    step = obs([3, 4], [0, 0], is_eval=[4],
               **{'log/x': np.float32([1.0, 2.0])})
    reply, trans = actor.act(step)
    assert set(reply) == {'action', 'reset'}
    assert replay.calls == [] and logger.calls == []  # Only after the reply.
    actor.send(trans)
    (name, data), = replay.calls
    assert name == 'add_batch'
    assert data['envid'].tolist() == [3, 4]
    assert data['is_eval'].tolist() == [False, True]
    assert (data['action'] == reply['action']).all()
    assert 'log/x' not in data  # Env metrics go to the logger only.
    (name, episode), = logger.calls
    assert name == 'tran'
    assert episode['log/x'].tolist() == [1.0, 2.0]
    assert 'action' not in episode  # The env's side of the step only.
    assert actor.settle()


def test_send_waits_for_room_and_gives_up_when_closing():
    logger = Client(hold=True)  # A logger that does not answer.
    actor, replay, _ = make_actor(
        logger=logger, actor_threads=1, hold_rows=1)  # Backlog 8.
    counts, blocked = 0, None
    for _ in range(actor.backlog + 1):
        _, trans = actor.act(obs([0], [counts]))
        counts += 1
        thread = threading.Thread(
            target=actor.send, args=(trans,), daemon=True)
        thread.start()
        thread.join(0.3)
        if thread.is_alive():
            blocked = thread
            break
    assert blocked, 'no send waited for room'
    assert len(logger.calls) <= actor.backlog  # At the backlog: waits.
    sent = len(replay.calls)
    logger.pending[0].set_result({})
    blocked.join(10)
    assert not blocked.is_alive() and len(replay.calls) == sent + 1
    # Full again; closing makes a waiting send give up.
    _, trans = actor.act(obs([0], [counts]))
    actor.closing.set()
    with pytest.raises(RuntimeError, match='shut down'):
        actor.send(trans)


def test_a_send_to_a_busy_replay_gives_up_when_closing():
    replay = Client(hold=True)
    actor, _, _ = make_actor(replay=replay, hold_rows=1)
    _, trans = actor.act(obs([0], [0]))
    actor.send(trans)  # The replay is idle: goes at once, and stays busy.
    _, trans = actor.act(obs([0], [1]))
    actor.closing.set()
    with pytest.raises(RuntimeError, match='shut down'):
        actor.send(trans)
    assert len(replay.calls) == 1


def test_sends_wait_while_the_replay_is_busy_and_go_on_as_one():
    replay, logger = Client(hold=True), Client()
    actor, _, _ = make_actor(replay=replay, logger=logger, hold_rows=8)
    sent = []
    for counts in ([0, 0], [1, 1], [2, 2]):
        _, trans = actor.act(obs([5, 6], counts))
        actor.send(trans)
        sent.append(trans[0]['count'].tolist())
    # The first went at once; the others wait for the replay's answer.
    assert len(replay.calls) == 1 and len(logger.calls) == 1
    actor.flush(force=False)
    assert len(replay.calls) == 1  # Still busy.
    replay.pending[0].set_result({})
    actor.flush(force=False)
    (_, first), (_, joined) = replay.calls
    assert first['count'].tolist() == sent[0]
    assert joined['count'].tolist() == sent[1] + sent[2]  # In order.
    assert joined['envid'].tolist() == [5, 6, 5, 6]
    assert logger.calls[1][1]['count'].tolist() == sent[1] + sent[2]
    # At `hold_rows` rows a send waits until the busy replay answers (one
    # send at a time is on its way to a busy replay), then goes on.
    for counts in ([3, 3], [4, 4], [5, 5]):
        _, trans = actor.act(obs([5, 6], counts))
        actor.send(trans)
    _, trans = actor.act(obs([5, 6], [6, 6]))
    waiting = threading.Thread(target=actor.send, args=(trans,), daemon=True)
    waiting.start()
    waiting.join(0.3)
    assert waiting.is_alive() and len(replay.calls) == 2
    replay.pending[1].set_result({})
    waiting.join(10)
    assert not waiting.is_alive() and len(replay.calls) == 3
    assert replay.calls[2][1]['count'].tolist() == [3, 3, 4, 4, 5, 5, 6, 6]


def test_drained_sends_what_waits():
    replay = Client(hold=True)
    actor, _, _ = make_actor(replay=replay)
    for counts in ([0, 0], [1, 1]):
        _, trans = actor.act(obs([1, 2], counts))
        actor.send(trans)
    assert len(replay.calls) == 1
    actor.flush()  # What `drained` does before it settles.
    assert len(replay.calls) == 2
    for future in replay.pending:
        future.set_result({})
    assert actor.settle()


def test_an_error_of_the_replay_surfaces_in_the_actor():
    replay = Client(hold=True)
    actor, _, _ = make_actor(replay=replay)
    _, trans = actor.act(obs([0], [0]))
    actor.send(trans)
    replay.pending[0].set_error(ValueError('bad key'))
    with pytest.raises(ValueError, match='bad key'):
        actor.settle()


def test_flush_counts_sends_that_arrived_as_gone():
    """While the actor is paused nothing settles the sends that arrived:
    `drained`'s flush must still find room for what is held."""
    replay = Client(hold=True)
    actor, _, _ = make_actor(replay=replay, actor_threads=1)  # Backlog 8.
    for counts in ([0, 0], [1, 1]):
        _, trans = actor.act(obs([1, 2], counts))
        actor.send(trans)  # The second is held: the replay is busy.
    assert len(replay.calls) == 1
    replay.pending[0].set_result({})
    actor.inflight.extend([replay.pending[0]] * 8)  # Arrived, not settled.
    assert actor.flush()
    assert replay.calls[-1][1]['count'].tolist() == [1, 1]
    replay.pending[-1].set_result({})
    assert actor.settle()
