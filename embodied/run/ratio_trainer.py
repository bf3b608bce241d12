"""Training from a replay at a fixed train ratio, for the single-process
runners (the parallel runner trains in its own learner thread).

Where the single-process scripts deliberately differ from the parallel
learner, as the original's train.py and parallel.py do:

* Train ratio: here a `Ratio` clock trains `train_ratio / (batch_size *
  batch_length)` batches per env step, in the env loop; the parallel replay
  enforces the same ratio with a samples-per-insert limiter
  (`train_ratio / batch_length` sequences per inserted step, with a
  tolerance), so its learner and actor run freely within that band.
* Report carry: here one report carry lives across reports; the parallel
  learner starts each report from `agent.init_report`.
"""

import elements

from embodied.run import reporting


class RatioTrainer:
    """A driver callback that trains `train_ratio` replayed steps per env step.

        trainer = RatioTrainer(agent, replay, make_stream, args, step)
        driver.on_step(trainer.on_step)
    """

    def __init__(self, agent, replay, make_stream, args, step):
        self.agent = agent
        self.replay = replay
        self.args = args
        self.step = step
        self.batch_steps = args.batch_size * args.batch_length
        self.should_train = elements.when.Ratio(
            args.train_ratio / self.batch_steps)
        self.stream_train = iter(agent.stream(make_stream(replay, 'train')))
        self.stream_report = iter(agent.stream(make_stream(replay, 'report')))
        self.carry_train = agent.init_train(args.batch_size)
        self.carry_report = agent.init_report(args.batch_size)
        self.agg = elements.Agg()
        self.fps = elements.FPS()
        # The last update's (outs, metrics): read after the next update is
        # dispatched (or at metrics()), so the device never waits for us.
        self.pending = None

    def on_step(self, tran, worker):
        if len(self.replay) < self.args.batch_size * self.args.batch_length:
            return
        for _ in range(self.should_train(self.step)):
            with elements.timer.section('stream_next'):
                batch = next(self.stream_train)
            self.carry_train, outs, mets = self.agent.train(
                self.carry_train, batch)
            self.fps.step(self.batch_steps)
            self._finish_update()
            self.pending = (outs, mets)

    def _finish_update(self):
        """Writes the pending update's replay context back and adds its
        metrics."""
        if self.pending is None:
            return
        (outs, mets), self.pending = self.pending, None
        if 'replay' in outs:
            self.replay.update(outs['replay'])
        self.agg.add(mets, prefix='train')

    def report(self):
        """Report metrics over `consec_report * report_batches` batches."""
        self.carry_report, metrics = reporting.report_on(
            self.agent, self.stream_report, self.args, self.carry_report)
        return metrics

    def metrics(self):
        self._finish_update()
        lag = getattr(self.agent, 'policy_lag', dict)()
        return {**self.agg.result(), **lag, 'fps/train': self.fps.result()}

    def close(self):
        """Stops the streams' read-ahead threads."""
        reporting.close_stream(self.stream_train)
        reporting.close_stream(self.stream_report)
