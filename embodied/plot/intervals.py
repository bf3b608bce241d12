"""IQM and optimality gap across tasks and seeds, with stratified bootstrap
confidence intervals: the method of rliable (Agarwal et al., 2021, "Deep RL
at the edge of the statistical precipice"), written with numpy alone.

rliable itself pulls in `arch` (and with it statsmodels), pandas, seaborn
and absl-py; what its `get_interval_estimates` computes for these two
metrics is a few lines of numpy, so the runtime needs nothing more. The
bootstrap resamples the runs of each task with replacement, separately per
task (the strata), keeps every task, computes the metric over all the
resampled runs, and takes the percentile interval of `reps` replications,
as rliable's default `percentile` method does. Unlike rliable's, the tasks
may have different numbers of runs.
"""

import numpy as np

REPS = 10000
SIZE = 0.95
CHUNK = 2 ** 22  # values resampled at once


def iqm(values, axis=None):
    """Interquartile mean: the mean of the values left after cutting
    `int(0.25 * n)` of the smallest and as many of the largest (scipy's
    `trim_mean(values, 0.25)`, as rliable's `aggregate_iqm`)."""
    values = np.asarray(values, float)
    if axis is None:
        values, axis = values.reshape(-1), 0
    values = np.sort(values, axis=axis)
    n = values.shape[axis]
    cut = int(0.25 * n)
    return np.take(values, np.arange(cut, n - cut), axis=axis).mean(axis)


def optimality_gap(values, gamma=1.0, axis=None):
    """How far the normalized scores fall short of `gamma` on average, each
    score capped at `gamma` (rliable's `aggregate_optimality_gap`)."""
    return gamma - np.minimum(np.asarray(values, float), gamma).mean(axis)


METRICS = {'iqm': ('IQM', iqm), 'optimality_gap': ('Optimality Gap', optimality_gap)}


def bootstrap(strata, metric, reps=REPS, size=SIZE, seed=0):
    """(point, low, high) of `metric` (a name of METRICS, or a function of
    an array and an `axis`) over the runs of all strata (one 1-d array of
    run scores per task), with the `size` percentile interval of `reps`
    stratified bootstrap replications drawn from `numpy.random.default_rng(
    seed)`: the same seed gives the same interval."""
    fn = METRICS[metric][1] if isinstance(metric, str) else metric
    strata = [np.asarray(s, float).reshape(-1) for s in strata]
    strata = [s for s in strata if len(s)]
    if not strata:
        raise ValueError('No scores to aggregate.')
    point = float(fn(np.concatenate(strata), axis=0))
    rng = np.random.default_rng(seed)
    total = sum(len(s) for s in strata)
    chunk = max(1, CHUNK // total)
    stats = []
    for start in range(0, reps, chunk):
        count = min(chunk, reps - start)
        sample = np.concatenate([
            s[rng.integers(0, len(s), (count, len(s)))] for s in strata], 1)
        stats.append(fn(sample, axis=1))
    stats = np.concatenate(stats)
    tail = 100 * (1 - size) / 2
    low, high = np.percentile(stats, [tail, 100 - tail])
    return point, float(low), float(high)
