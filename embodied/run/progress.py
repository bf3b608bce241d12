"""Progress lines with elapsed time and ETA, and final summaries, for the
parallel launcher (`Progress`) and the single-process scripts (`Eta`)."""

import collections
import math
import time

import psutil


class Eta:
    """Elapsed time since construction and the time left until `steps`
    env steps or `duration` seconds (whichever comes first; 0 = no
    duration). The step rate is measured over the last `window` seconds of
    `observe` calls, so it follows changes such as training starting; pass
    the current `step` when it is known at the start (a resumed run).

        eta = Eta(args.steps, args.duration, step)
        eta.observe(step)      # often; cheap
        print(eta.text(step))  # 'elapsed 0:05:12 | ETA 0:47:10'
    """

    def __init__(self, steps, duration=0, step=None, window=300,
                 clock=time.monotonic):
        self.steps = float(steps)
        self.duration = float(duration or 0)
        self.window = window
        self.clock = clock
        self.start = clock()
        self.history = collections.deque()  # (seconds, step)
        if step is not None:
            self.history.append((self.start, int(step)))

    @property
    def elapsed(self):
        return self.clock() - self.start

    def observe(self, step):
        now = self.clock()
        if len(self.history) > 1 and now - self.history[-2][0] < 1:
            self.history[-1] = (now, step)  # At most one entry a second.
        else:
            self.history.append((now, step))
        while len(self.history) > 2 and now - self.history[1][0] >= self.window:
            self.history.popleft()

    def remaining(self, step):
        """Seconds left (an estimate), or None while the rate is unknown
        and there is no duration."""
        self.observe(step)
        left = []
        if self.duration:
            left.append(max(0.0, self.duration - self.elapsed))
        (t0, s0), (t1, s1) = self.history[0], self.history[-1]
        if step >= self.steps:
            left.append(0.0)
        elif s1 > s0 and t1 > t0:
            left.append((self.steps - step) / ((s1 - s0) / (t1 - t0)))
        return min(left) if left else None

    def text(self, step):
        left = self.remaining(step)
        eta = '?' if left is None else duration_text(left)
        return f'elapsed {duration_text(self.elapsed)} | ETA {eta}'

    def line(self, step):
        """A progress line: 'step 600/1000 | elapsed 0:00:05 | ETA 0:00:03'."""
        step = int(step)
        return f'step {step}/{int(self.steps)} | {self.text(step)}'

    def summary(self, step, score=None):
        """The final line's `key=value` pairs (`final_summary`)."""
        return summary_text(final_summary(step, self.elapsed, score))


def duration_text(seconds):
    """'H:MM:SS', with days in front past a day ('2d 3:04:05')."""
    if not math.isfinite(seconds):
        return '?'
    seconds = int(round(seconds))
    days, seconds = divmod(seconds, 86400)
    if days > 999:
        return '>999d'
    hours, seconds = divmod(seconds, 3600)
    minutes, seconds = divmod(seconds, 60)
    text = f'{hours}:{minutes:02d}:{seconds:02d}'
    return f'{days}d {text}' if days else text


def summary_text(values):
    """`key=value` pairs, numbers only, for a `[Summary]` line."""
    return ' '.join(f'{k}={v}' for k, v in values.items())


def final_summary(step, seconds, score=None):
    """The values every run ends with: env steps, wall seconds and, when
    episodes finished, the mean score of the latest ones."""
    values = dict(steps=int(step), wall_s=round(seconds, 1))
    if score is not None and math.isfinite(score):
        values['score'] = round(float(score), 3)
    return values


class Progress:
    """The launcher's progress lines and final summary from role status."""

    SERVER_KEYS = ('batches', 'rows', 'partial', 'wait_seconds',
                   'busy_seconds')

    def __init__(self, args):
        self.args = args
        self.eta = Eta(args.steps, args.duration)
        self.step = 0
        self.last = None
        self.totals = collections.Counter()
        self.first_step = None  # Seconds from process start to first step.
        self.running_since = None

    def observe(self, step):
        self.step = step
        self.eta.observe(step)
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
        self.step = step
        progress = f'step {step}/{int(args.steps)} | {self.eta.text(step)}'
        if last is None:
            return progress
        span = max(1e-6, now - last['time'])
        rate = lambda key: (current[key] - last[key]) / span
        share = lambda key: f'{min(100, 100 * rate(key)):.0f}%'
        batches = max(1, interval['batches'])
        return ' | '.join([
            progress,
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

    def summary(self, actor, env_restarts=0, score=None):
        """The final summary (`final_summary`: steps, wall seconds since the
        launch, `score` when given) and the totals since the first env
        step, as `key=value` pairs."""
        seconds = time.monotonic() - (self.running_since or time.monotonic())
        steps = actor.get('policy_steps', 0)
        train = actor.get('learner_train_steps', 0)
        batches = max(1, self.totals['batches'])
        latency = (self.totals['wait_seconds'] +
                   self.totals['busy_seconds']) / batches
        values = dict(
            **final_summary(self.step, self.eta.elapsed, score),
            env_steps=int(steps), train_steps=int(train),
            seconds=round(seconds, 2),
            env_fps=round(steps / max(seconds, 1e-6), 1),
            train_fps=round(train / max(seconds, 1e-6), 2),
            policy_batch_ms=round(1000 * latency, 3),
            policy_batch_envs=round(self.totals['rows'] / batches, 2),
            first_step_s=round(self.first_step or -1, 2),
            env_restarts=env_restarts,
            shared_batches=int(actor.get('learner_train_shared_batches', 0)))
        return summary_text(values)
