"""Runs read from logdirs, and their curves binned onto a common axis."""

import dataclasses
import json
import pathlib
import re
import warnings

import numpy as np

SCORES = 'scores.jsonl'


@dataclasses.dataclass
class Run:
    """The episodes of one run: env step, wall seconds (NaN when the file
    has no `time` column) and value of `key` at each."""

    path: pathlib.Path
    label: str
    steps: np.ndarray
    times: np.ndarray
    values: np.ndarray


def find(paths, filename=SCORES):
    """The run folders under `paths`: each path that holds `filename`, or
    every folder below it that does."""
    found = []
    for path in map(pathlib.Path, paths):
        if (path / filename).is_file():
            found.append(path)
            continue
        below = sorted(p.parent for p in path.glob(f'**/{filename}'))
        if not below:
            raise FileNotFoundError(
                f'No {filename} in {path} or any folder below it.')
        found.extend(below)
    return found


def label_for(path, pattern=None):
    """A run's label: the name of its parent folder, or with `pattern` (a
    regex searched in the run's path) the first group, or the whole match
    when it has no group."""
    if not pattern:
        return path.resolve().parent.name
    match = re.search(pattern, str(path))
    if not match:
        raise ValueError(f"--label '{pattern}' does not match {path}.")
    return match.group(1) if match.groups() else match.group(0)


def load(path, key='episode/score', label=None, filename=SCORES):
    """Reads one run. A line cut short by a writer still at work is
    skipped."""
    path = pathlib.Path(path)
    steps, times, values = [], [], []
    with open(path / filename) as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if key not in row:
                continue
            steps.append(row['step'])
            times.append(row.get('time', np.nan))
            values.append(row[key])
    if not steps:
        raise ValueError(f"No '{key}' in {path / filename}.")
    return Run(path, label or label_for(path), np.asarray(steps, float),
               np.asarray(times, float), np.asarray(values, float))


def binned(runs, axis, bins, limit=None):
    """Averages each run's values in `bins` equal bins of `axis` ('steps' or
    'times') from 0 to `limit` (default: the largest x of all runs). Returns
    the bin ends and an array (runs, bins), NaN where a run has no episode."""
    xs = [getattr(run, axis) for run in runs]
    limit = limit or max(np.nanmax(x) for x in xs)
    edges = np.linspace(0, limit, bins + 1)
    table = np.full((len(runs), bins), np.nan)
    for i, (x, run) in enumerate(zip(xs, runs)):
        keep = np.isfinite(x) & np.isfinite(run.values)
        index = np.clip(np.searchsorted(edges, x[keep], 'left') - 1, 0, bins - 1)
        sums = np.bincount(index, run.values[keep], bins)
        counts = np.bincount(index, None, bins)
        np.divide(sums, counts, out=table[i], where=counts > 0)
    return edges[1:], table


def spread(table, kind='std'):
    """Mean over runs (rows) and the band around it: mean ± std, or the
    min and max over runs."""
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', RuntimeWarning)
        mean = np.nanmean(table, 0)
        if kind == 'std':
            std = np.nanstd(table, 0)
            return mean, mean - std, mean + std
        if kind == 'minmax':
            return mean, np.nanmin(table, 0), np.nanmax(table, 0)
    raise ValueError(f"Unknown spread '{kind}': choose std or minmax.")
