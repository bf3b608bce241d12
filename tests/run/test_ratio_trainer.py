"""The single-process runners' trainer: reads each update's results one
update late and never drops the last."""

import elements
import numpy as np

import embodied
from embodied.run import ratio_trainer


class CountingAgent:
    """Trains by counting; each update's outputs write its number into the
    replay context of the steps it trained on."""

    def __init__(self):
        self.updates = 0

    def stream(self, st):
        return st

    def init_train(self, batch_size):
        return None

    init_report = init_train

    def train(self, carry, data):
        self.updates += 1
        stepid = data['stepid']
        value = np.full(stepid.shape[:2], self.updates, np.float32)
        outs = {'replay': {'stepid': stepid, 'trained': value}}
        return carry, outs, {'update': np.float32(self.updates)}

    def policy_lag(self):
        return {'policy_lag/mean': 0.0, 'policy_lag/max': 0}


def test_ratio_trainer_writes_every_update_back_one_late_and_flushes():
    replay = embodied.Replay(length=4, capacity=100)
    for t in range(16):
        replay.add({'x': np.float32(t), 'trained': np.float32(0)})
    args = elements.Config(
        batch_size=2, batch_length=4, train_ratio=8.0, consec_report=1,
        report_batches=1)
    agent = CountingAgent()

    def make_stream(replay, mode):
        return embodied.streams.Stateless(replay.sample, 2, mode)

    step = elements.Counter()
    trainer = ratio_trainer.RatioTrainer(agent, replay, make_stream, args, step)
    for _ in range(3):
        step.increment()
        trainer.on_step({}, 0)
    updates = agent.updates
    assert updates >= 2
    # The last update's results wait for the next update (or metrics()).
    assert replay.stats()['updates'] == (updates - 1) * 2 * 4
    metrics = trainer.metrics()
    assert replay.stats()['updates'] == 2 * 4
    assert metrics['train/update'] == np.mean(range(1, updates + 1))
    assert metrics['policy_lag/max'] == 0
    trainer.close()


def test_negative_train_ratio_trains_one_batch_per_env_step():
    # The original's `train_ratio: -1` in the single-process scripts.
    replay = embodied.Replay(length=4, capacity=100)
    for t in range(16):
        replay.add({'x': np.float32(t), 'trained': np.float32(0)})
    args = elements.Config(
        batch_size=2, batch_length=4, train_ratio=-1.0, consec_report=1,
        report_batches=1)
    agent = CountingAgent()

    def make_stream(replay, mode):
        return embodied.streams.Stateless(replay.sample, 2, mode)

    step = elements.Counter()
    trainer = ratio_trainer.RatioTrainer(agent, replay, make_stream, args, step)
    for calls in range(1, 6):
        step.increment()
        trainer.on_step({}, 0)
        assert agent.updates == calls
    trainer.close()
