"""The paper's aggregates over tasks, as the original's plot.py computes them.

Each takes a method's binned runs, `{task: array (seeds, bins)}` on one
number of bins, averages the seeds of each task (NaN-aware), normalizes
each task by its (low, high) where the statistic has a table, and reduces
over tasks at each bin:

| name | title | reduction | normalized by |
| --- | --- | --- | --- |
| `mean`, `median` | Mean, Median | mean, median | - |
| `atari_mean`, `atari_median` | Gamer Mean, Gamer Median | mean, median | `atari57_gamer` |
| `dmlab_mean` | DMLab Mean | mean | `dmlab30` |
| `dmlab_mean_capped` | DMLab Capped Mean | mean of min(x, 1) | `dmlab30` |
| `procgen_mean` | Normalized Mean | mean | `procgen_hard` |
| `self_mean`, `self_median` | Self Mean, Self Median | NaN-aware mean, median | each task's min and max over every run given |
| `runs` | Runs | runs with a score in the bin | - |

As in the original, all but the self-normalized ones are NaN where any
task has no score in the bin, and `auto` picks the suite's: `mean` and
`median` when every task is `dmc_`, the Atari ones when every task is
`atari_`, the DMLab ones for `dmlab_`, `procgen_mean` for `procgen_`. (The
original titles both DMLab statistics 'Capped Mean', and takes a task's
self-normalization range with Python's min and max, which a NaN bin makes
depend on the order; here they are NumPy's NaN-aware ones.)
"""

import warnings

import numpy as np

from . import published

STATS = {
    'runs': ('Runs', None, None),
    'mean': ('Mean', np.mean, None),
    'median': ('Median', np.median, None),
    'self_mean': ('Self Mean', np.nanmean, 'self'),
    'self_median': ('Self Median', np.nanmedian, 'self'),
    'atari_mean': ('Gamer Mean', np.mean, 'atari57_gamer'),
    'atari_median': ('Gamer Median', np.median, 'atari57_gamer'),
    'dmlab_mean': ('DMLab Mean', np.mean, 'dmlab30'),
    'dmlab_mean_capped': (
        'DMLab Capped Mean', lambda x, axis: np.minimum(x, 1).mean(axis),
        'dmlab30'),
    'procgen_mean': ('Normalized Mean', np.mean, 'procgen_hard'),
}
AUTO = (('atari_', ('atari_mean', 'atari_median')),
        ('dmc_', ('mean', 'median')),
        ('dmlab_', ('dmlab_mean', 'dmlab_mean_capped')),
        ('procgen_', ('procgen_mean',)))


def choose(names, tasks):
    """The statistics `names` asks for, with `auto` expanded for `tasks`
    (published names) and `none` dropped."""
    chosen = []
    for name in names:
        if name == 'auto':
            for prefix, stats in AUTO:
                if tasks and all(t.startswith(prefix) for t in tasks):
                    chosen.extend(stats)
        elif name == 'none':
            continue
        elif name in STATS:
            chosen.append(name)
        else:
            raise ValueError(
                f"Unknown statistic '{name}' (known: auto, none, "
                f"{', '.join(STATS)}).")
    return list(dict.fromkeys(chosen))


def self_ranges(*tables):
    """{task: (low, high)}: the smallest and largest binned score of each
    task over every method's runs given."""
    ranges = {}
    for table in tables:
        for task, values in table.items():
            with warnings.catch_warnings():
                warnings.simplefilter('ignore', RuntimeWarning)
                lo, hi = np.nanmin(values), np.nanmax(values)
            if task in ranges:
                lo, hi = min(lo, ranges[task][0]), max(hi, ranges[task][1])
            ranges[task] = (lo, hi)
    return ranges


def ranges_of(table_name, tasks, self_range=None):
    """{task: (low, high)} of a normalization table for `tasks`; a task
    the table lacks is a ValueError naming it."""
    rows = self_range if table_name == 'self' else (
        published.normalization()[table_name])
    missing = [t for t in tasks if t not in rows]
    if missing:
        raise ValueError(
            f"No normalization of {', '.join(missing)} in {table_name}.")
    return {t: rows[t] for t in tasks}


def curve(name, table, self_range=None):
    """The statistic `name` at each bin for one method's `table` ({task:
    (seeds, bins)}, published task names)."""
    _, reduce, norm = STATS[name]
    tasks = sorted(table)
    if name == 'runs':
        return np.isfinite(np.concatenate([table[t] for t in tasks])).sum(0)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', RuntimeWarning)
        means = np.stack([np.nanmean(table[t], 0) for t in tasks])
        if norm:
            ranges = ranges_of(norm, tasks, self_range)
            lo = np.array([ranges[t][0] for t in tasks])[:, None]
            hi = np.array([ranges[t][1] for t in tasks])[:, None]
            means = (means - lo) / (hi - lo)
        return np.asarray(reduce(means, axis=0), float)


def title(name):
    return STATS[name][0]
