"""Progress lines with elapsed time and ETA, and the final summary line."""

import re

import elements
import numpy as np
import pytest

import launch
from embodied.run import episodes as episodeslib
from embodied.run import progress


class FakeClock:

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_eta_from_recent_step_rate():
    clock = FakeClock()
    eta = progress.Eta(10100, step=0, window=30, clock=clock)
    assert eta.remaining(0) is None  # No rate yet.
    assert eta.text(0) == 'elapsed 0:00:00 | ETA ?'
    clock.now += 100
    assert eta.remaining(100) == pytest.approx(10000)  # 1 step/s so far.
    clock.now += 10
    eta.observe(1100)
    clock.now += 30
    # Only the last 30 s count: 3000 steps in 30 s, 6000 left. (Over the
    # whole run it would be 4100 steps in 140 s.)
    assert eta.remaining(4100) == pytest.approx(60)
    assert eta.line(4100) == 'step 4100/10100 | elapsed 0:02:20 | ETA 0:01:00'
    assert eta.remaining(10100) == 0


def test_eta_takes_the_duration_when_it_comes_first():
    clock = FakeClock()
    eta = progress.Eta(1e10, duration=3600, step=0, clock=clock)
    assert eta.remaining(0) == 3600  # Known before any rate.
    clock.now += 600
    assert eta.remaining(6000) == pytest.approx(3000)
    assert eta.text(6000) == 'elapsed 0:10:00 | ETA 0:50:00'


def test_duration_text():
    assert progress.duration_text(0) == '0:00:00'
    assert progress.duration_text(3725.4) == '1:02:05'
    assert progress.duration_text(2 * 86400 + 3 * 3600 + 4 * 60 + 5) == (
        '2d 3:04:05')
    assert progress.duration_text(1e12) == '>999d'
    assert progress.duration_text(float('inf')) == '?'


def summary_values(line):
    return {k: float(v) for k, v in (x.split('=') for x in line.split())}


def test_parallel_summary_has_steps_wall_time_and_score():
    args = elements.Config(steps=1000, duration=0, actor_batch=2)
    tracker = progress.Progress(args)
    tracker.observe(250)
    actor = {'policy_steps': 300, 'learner_train_steps': 10}
    values = summary_values(tracker.summary(actor, 0, score=12.5))
    assert values['steps'] == 250 and values['score'] == 12.5
    assert 0 <= values['wall_s'] < 60
    assert values['env_steps'] == 300  # The totals are still there.
    assert 'score' not in summary_values(tracker.summary(actor, 0))
    assert 'score' not in summary_values(
        tracker.summary(actor, 0, float('nan')))
    line = tracker.line(1.0, 260, actor, {})
    assert re.fullmatch(
        r'step 260/1000 \| elapsed \d:\d\d:\d\d \| ETA \S+', line), line


def test_recent_score_is_the_mean_of_the_latest_episodes():
    logger = elements.Logger(elements.Counter(), [lambda summaries: None])
    stats = episodeslib.EpisodeStats(logger, recent=3)
    assert np.isnan(stats.recent_score())
    for score in (1, 2, 3, 10):  # Episodes of `score` reward steps.
        stats.add(dict(reward=0.0, is_first=True, is_last=False), 0)
        for i in range(score):
            stats.add(dict(reward=1.0, is_first=False,
                           is_last=i == score - 1), 0)
    assert stats.recent_score() == pytest.approx((2 + 3 + 10) / 3)


def test_add_batch_gives_what_add_gives_row_by_row():
    def written(feed):
        rows = []
        logger = elements.Logger(elements.Counter(), [
            lambda summaries: rows.append(
                {k: v for _, k, v in summaries if not k.endswith('video')})])
        stats = episodeslib.EpisodeStats(logger)
        rng = np.random.default_rng(0)
        for t in range(30):  # Two envs, episodes of different lengths.
            batch = {
                'reward': rng.normal(size=2).astype(np.float32),
                'is_first': np.array([t % 7 == 0, t % 5 == 0]),
                'is_last': np.array([t % 7 == 6, t % 5 == 4]),
                'image': rng.integers(0, 255, (2, 4, 4, 3), np.uint8),
                'log/x': np.float32([t, np.nan if t % 3 else -t]),
            }
            feed(stats, batch, [0, 1])
        logger.add(stats.result(), prefix='epstats')
        logger.write()
        return rows, stats.recent_score()

    def by_row(stats, batch, workers):
        for i, worker in enumerate(workers):
            stats.add({k: v[i] for k, v in batch.items()}, worker)

    rows, score = written(by_row)
    assert rows and any('epstats/log/x/sum' in row for row in rows)
    batched = written(lambda s, b, w: s.add_batch(b, w))
    assert repr(batched) == repr((rows, score))  # repr: NaN equals NaN.


def test_add_batch_refuses_a_log_metric_that_is_no_scalar():
    logger = elements.Logger(elements.Counter(), [lambda summaries: None])
    stats = episodeslib.EpisodeStats(logger)
    with pytest.raises(ValueError, match="Env metric 'log/v' must be a "
                                         "scalar"):
        stats.add_batch({'reward': np.zeros(2), 'is_first': np.ones(2, bool),
                         'is_last': np.zeros(2, bool),
                         'log/v': np.zeros((2, 3))}, [0, 1])


@pytest.mark.slow
@pytest.mark.parametrize('script', ['train', 'eval_only'])
def test_scripts_print_progress_and_summary(tmp_path, script):
    logdir = tmp_path / 'run'
    flags = (
        '--configs', 'debug', '--agent_impl', 'testing', '--task',
        'dummy_disc', '--env.dummy.length', 20, '--env.dummy.size', 16, 16,
        '--run.envs', 2, '--run.log_every', 1)
    if script == 'eval_only':
        result = launch.run('--script', 'train', *flags, '--run.steps', 100,
                            '--logdir', logdir)
        assert result.returncode == 0, result.stdout[-3000:]
    # Long enough for a progress line (run.log_every 1 s) on a fast machine:
    # evaluating runs 4000 steps in under a second.
    steps = 4000 if script == 'train' else 40000
    result = launch.run('--script', script, *flags, '--run.steps', steps,
                        '--logdir', logdir)
    assert result.returncode == 0, result.stdout[-3000:]
    lines = re.findall(r'\[Progress\] (.*)', result.stdout)
    assert lines, result.stdout[-3000:]
    for line in lines:
        assert re.fullmatch(
            rf'step \d+/{steps} \| elapsed \d:\d\d:\d\d \| ETA '
            r'(\?|\d:\d\d:\d\d)', line), line
    summary = summary_values(re.findall(r'\[Summary\] (.*)', result.stdout)[-1])
    assert summary['steps'] >= 4000
    assert summary['score'] == 20  # Dummy: reward 1 on each of 20 steps.
    assert summary['wall_s'] > 0
