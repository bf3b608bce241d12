"""The logger process's role in-process: no sockets, no subprocesses."""

import elements
import helpers
import numpy as np
import pytest

from embodied.run import arguments
from embodied.run.parallel.logger import LoggerRole


class Written:
    """An elements.Logger output that keeps what was written."""

    def __init__(self):
        self.rows = []

    def __call__(self, summaries):
        self.rows.append({key: value for _, key, value in summaries})


def make_role(**kwargs):
    output = Written()
    logger = elements.Logger(elements.Counter(), [output])
    args = arguments.with_defaults(dict(logdir='/tmp/unused', **kwargs))
    return LoggerRole(logger, args), output


def trans(envids, rewards, is_first, is_last, is_eval=(), **extra):
    n = len(envids)
    return {
        'envid': np.asarray(envids, np.int64),
        'is_eval': np.isin(envids, list(is_eval)),
        'reward': np.asarray(rewards, np.float32),
        'is_first': np.asarray(is_first, bool),
        'is_last': np.asarray(is_last, bool),
        'is_terminal': np.zeros(n, bool), **extra,
    }


def test_step_counts_train_rows_only():
    role, _ = make_role()
    role.tran(trans([0, 1, 2], [0, 0, 0], [1, 1, 1], [0, 0, 0], is_eval=[2]))
    role.tran(trans([0, 2], [0, 0], [0, 0], [0, 0], is_eval=[2]))
    status = role.status()
    assert status['step'] == 3 and int(role.step) == 3
    assert status['env_steps'] == 5


def test_episodes_score_per_env_and_eval_apart():
    role, output = make_role()
    # Env 0 and eval env 1 interleave; each episode: rewards 0, 1, 2.
    for t in range(3):
        role.tran(trans([0, 1], [t, 10 * t], [t == 0] * 2, [t == 2] * 2,
                        is_eval=[1], **{'log/x': np.float32([t, t])}))
    assert role.status()['score'] == 3.0  # Train episodes only.
    role.write()
    row, = output.rows
    assert row['episode/score'] == 3.0 and row['episode/length'] == 2
    assert row['eval_episode/score'] == 30.0
    assert row['epstats/log/x/sum'] == 3.0
    assert row['parallel/ep_starts'] == 2 and row['parallel/ep_ends'] == 2


def test_videos_of_the_first_train_env_and_the_first_eval_env():
    # Train envs 0 and 1, eval envs 2 and 3: each frame shows its env id
    # and step, so the videos name the env they came from.
    role, output = make_role(envs=2, eval_envs=2)
    envids = [0, 1, 2, 3]
    for t in range(3):
        frames = np.zeros((4, 2, 2, 3), np.uint8)
        frames[:, 0, 0, 0] = envids
        frames[:, 0, 0, 1] = t
        role.tran(trans(envids, [0] * 4, [t == 0] * 4, [t == 2] * 4,
                        is_eval=[2, 3], **{'log/image': frames}))
    role.write()
    row, = output.rows
    for key, envid in (('epstats/policy_log/image', 0),
                       ('eval_epstats/policy_log/image', 2)):
        video = row[key]
        assert video.shape == (3, 2, 2, 3), key
        assert video[:, 0, 0, 0].tolist() == [envid] * 3, key
        assert video[:, 0, 0, 1].tolist() == [0, 1, 2], key


def test_abandon_drops_the_unfinished_episode():
    role, output = make_role()
    role.tran(trans([0, 1], [5, 5], [1, 1], [0, 0]))
    role.abandon([0])
    role.tran(trans([0, 1], [1, 1], [0, 0], [1, 1]))
    # Env 0's episode restarts from its next step; env 1's is whole.
    assert role.status()['score'] == pytest.approx((6.0 + 1.0) / 2)
    role.write()
    assert output.rows[-1]['parallel/ep_abandoned'] == 1
    assert output.rows[-1]['parallel/env_crashes'] == 1


def test_write_only_when_something_arrived():
    role, output = make_role()
    role.write()
    assert output.rows == []
    role.add({'train/loss': 1.5})
    role.write(lambda: {'calls': 1})
    assert output.rows[-1]['train/loss'] == 1.5
    assert output.rows[-1]['server/logger/calls'] == 1
    role.write()
    assert len(output.rows) == 1


def test_silent_envs_lose_their_episode_at_the_next_write():
    role, output = make_role(episode_timeout=0)
    role.tran(trans([0], [1], [1], [0]))
    role.write()  # Env 0 is older than the timeout of 0 s.
    role.tran(trans([0], [2], [0], [1]))
    assert role.status()['score'] == 2.0  # The first step was dropped.


def test_save_under_the_lock():
    role, _ = make_role()
    role.checkpoint = helpers.LockedCheckpoint(role.lock)
    assert role.save(12.0) == 12 and role.checkpoint.saved == [12]


def test_several_replicas_write_the_sum_of_their_env_steps():
    """With several replicas the step written and the run's step in
    `status` are this replica's env steps plus the other replicas' as the
    learners last exchanged them (`replica_steps`); before the first
    exchange, this replica's steps times the replicas."""
    steps = []
    logger = elements.Logger(
        elements.Counter(), [lambda rows: steps.extend(s for s, _, _ in rows)])
    args = arguments.with_defaults(dict(
        logdir='/tmp/unused', replica=0, replicas=3))
    role = LoggerRole(logger, args)
    role.tran(trans([0, 1], [0, 0], [1, 1], [0, 0]))
    assert role.status()['step'] == 2
    assert role.status()['run_step'] == 6
    assert role.replica_steps() == 2
    assert role.replica_steps([2, 7, 1]) == 2
    role.tran(trans([0, 1], [0, 0], [0, 0], [0, 0]))  # Counted at once.
    assert role.status()['step'] == 4
    assert role.status()['run_step'] == 4 + 7 + 1
    role.write()
    assert steps and set(steps) == {12}
    # Its own step (the one saved and resumed) stays its own.
    assert int(role.step) == 4
    with pytest.raises(ValueError, match='3 replicas'):
        role.replica_steps([1, 2])
