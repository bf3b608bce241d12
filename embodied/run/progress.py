"""The parallel launcher's progress lines and final summary."""

import collections
import time

import psutil


class Progress:
    """The launcher's progress lines and final summary from role status."""

    SERVER_KEYS = ('batches', 'rows', 'partial', 'wait_seconds',
                   'busy_seconds')

    def __init__(self, args):
        self.args = args
        self.last = None
        self.totals = collections.Counter()
        self.first_step = None  # Seconds from process start to first step.
        self.running_since = None

    def observe(self, step):
        if step > 0 and self.first_step is None:
            self.running_since = time.monotonic()
            self.first_step = time.time() - psutil.Process().create_time()
            print(f'First env step {self.first_step:.1f} s after launch.',
                  flush=True)

    def line(self, now, step, actor, replay):
        args = self.args
        interval = {k: actor.get(f'server/act/{k}', 0)
                    for k in self.SERVER_KEYS}
        self.totals.update(interval)
        current = dict(
            time=now, step=step, policy=actor.get('policy_steps', 0),
            train=actor.get('learner_train_steps', 0),
            insert_wait=replay.get('insert_wait_seconds', 0),
            sample_wait=replay.get('sample_wait_seconds', 0),
            batch_wait=actor.get('learner_train_wait_seconds', 0))
        last, self.last = self.last, current
        if last is None:
            return f'step {step}/{int(args.steps)}'
        span = max(1e-6, now - last['time'])
        rate = lambda key: (current[key] - last[key]) / span
        share = lambda key: f'{min(100, 100 * rate(key)):.0f}%'
        batches = max(1, interval['batches'])
        return ' | '.join([
            f'step {step}/{int(args.steps)}',
            f'env {rate("policy"):.1f}/s',
            f'train {rate("train"):.2f}/s',
            f'replay {int(replay.get("size", 0))} '
            f'(min {int(replay.get("minsize", 0))})',
            f'waits: replay inserts on limiter {share("insert_wait")}, '
            f'learner samples on limiter {share("sample_wait")}, '
            f'learner on batches {share("batch_wait")}',
            f'policy batches {interval["rows"] / batches:.1f}/'
            f'{args.actor_batch} envs '
            f'({100 * interval["partial"] / batches:.0f}% partial, '
            f'{1000 * interval["wait_seconds"] / batches:.1f} ms filling)',
        ])

    def summary(self, actor, env_restarts=0):
        """Totals since the first env step, as `key=value` pairs."""
        seconds = time.monotonic() - (self.running_since or time.monotonic())
        steps = actor.get('policy_steps', 0)
        train = actor.get('learner_train_steps', 0)
        batches = max(1, self.totals['batches'])
        latency = (self.totals['wait_seconds'] +
                   self.totals['busy_seconds']) / batches
        values = dict(
            env_steps=int(steps), train_steps=int(train),
            seconds=round(seconds, 2),
            env_fps=round(steps / max(seconds, 1e-6), 1),
            train_fps=round(train / max(seconds, 1e-6), 2),
            policy_batch_ms=round(1000 * latency, 3),
            policy_batch_envs=round(self.totals['rows'] / batches, 2),
            first_step_s=round(self.first_step or -1, 2),
            env_restarts=env_restarts,
            shared_batches=int(actor.get('learner_train_shared_batches', 0)))
        return ' '.join(f'{k}={v}' for k, v in values.items())
