"""Runs of ours beside published ones, on the published env-step grid.

`build` takes our Records (run folders or scores files) and the published
ones (DreamerV3's shipped runs of a suite, or any scores file), maps our
task names to the published ones (`tasks`), puts every run on each task's
published grid (`bins`), and returns a Report: the binned runs of every
method and task, the paper's aggregates at each bin, and IQM and
optimality gap with bootstrap intervals at one bin.
"""

import dataclasses
import re
import warnings

import numpy as np

from . import aggregates
from . import bins as binslib
from . import intervals
from . import published
from . import tasks as taskslib

DMC_RANGE = (0.0, 1000.0)  # a DMC episode scores at most 1000


@dataclasses.dataclass
class Binned:
    """One method's runs of one task on the task's grid: `values` is
    (seeds, bins), NaN where a run has no episode in a bin."""

    seeds: list
    values: np.ndarray

    def mean(self):
        with warnings.catch_warnings():
            warnings.simplefilter('ignore', RuntimeWarning)
            return np.nanmean(self.values, 0)

    def band(self):
        """(min, max) over seeds at each bin."""
        with warnings.catch_warnings():
            warnings.simplefilter('ignore', RuntimeWarning)
            return np.nanmin(self.values, 0), np.nanmax(self.values, 0)


@dataclasses.dataclass
class Interval:
    point: float
    low: float
    high: float


@dataclasses.dataclass
class Report:
    """Everything the table and the plot show.

    ours / references: {method: {task: Binned}} (published task names);
    grids: {task: Grid}; band: the reference method whose band the verdicts
    use; source: where the references came from; names: {published task:
    our task}; stats: {stat: {method: values per bin}}; at: the bin index of
    the interval estimates (None without scores there); normalized: the
    normalization the intervals used ('' for raw scores); iqm, gap:
    {method: Interval}; notes: lines for the user. stats, iqm and gap
    label the published methods '<method> (published)' (`label`).
    """

    ours: dict
    references: dict
    grids: dict
    band: str
    source: str
    names: dict
    stats: dict = dataclasses.field(default_factory=dict)
    at: int = None
    normalized: str = ''
    iqm: dict = dataclasses.field(default_factory=dict)
    gap: dict = dataclasses.field(default_factory=dict)
    notes: list = dataclasses.field(default_factory=list)

    @property
    def tasks(self):
        return list(self.grids)

    def at_step(self):
        """The env step of the interval estimates' bin (the largest over
        tasks where their grids differ), or None."""
        if self.at is None:
            return None
        return max(float(g.xs[self.at]) for g in self.grids.values()
                   if self.at < len(g.xs))


def build(ours, references, source='', band=published.METHOD, task_filter='',
          bins=binslib.BINS, binsize=0, stats=('runs', 'auto'), at=0,
          normalize='auto', reps=intervals.REPS, seed=0):
    """The Report of `ours` (Records) against `references` (Records): see
    the module docstring. `at` is the env step of the interval estimates
    (0: the last bin where every method of ours has a score on every task).
    `normalize`: 'auto' (the suite's table, DMC's 0-1000, else raw), 'self'
    or 'none'."""
    known = {r.task for r in references}
    names = {}
    renamed = []
    for record in ours:
        name = taskslib.find(record.task, known) or record.task
        names.setdefault(name, record.task)
        renamed.append(dataclasses.replace(record, task=name))
    ours = renamed
    wanted = sorted({r.task for r in ours} or known, key=natural)
    if task_filter:
        pattern = re.compile(task_filter)
        wanted = [t for t in wanted if pattern.search(t)]
        if not wanted:
            raise ValueError(f"--tasks '{task_filter}' matches no task.")
    notes = []
    if references:
        missing = [t for t in wanted if t not in known]
        if ours and len(missing) == len(wanted):
            raise ValueError(
                f"{source or 'The published runs'} has no runs of "
                f"{', '.join(names.get(t, t) for t in missing)} (it has "
                f"{', '.join(sorted(known, key=natural)[:6])}"
                f"{' ...' if len(known) > 6 else ''}).")
        for task in missing:
            notes.append(f'No published runs of {names.get(task, task)} in '
                         f'{source}: its runs are shown alone.')
        methods = {r.method for r in references}
        if band not in methods:
            band = sorted(methods)[0]
    grids = {}
    xlim = 0
    if binsize:
        xlim = max(float(np.nanmax(r.xs)) for r in [*ours, *references]
                   if r.task in wanted and len(r.xs))
    for task in wanted:
        own = [r for r in references if r.task == task and r.method == band]
        own = own or [r for r in references if r.task == task] or [
            r for r in ours if r.task == task]
        own = [r for r in own if len(r.xs)]
        if not own:
            raise ValueError(f'No scores of {names.get(task, task)} to plot.')
        grids[task] = binslib.grid(own, bins, binsize, xlim,
                                   prebinned=bool(references))
    report = Report(
        ours=place(ours, grids, False), references=place(references, grids, True),
        grids=grids, band=band, source=source, names=names, notes=notes)
    compute_stats(report, stats)
    compute_intervals(report, at, normalize, reps, seed)
    return report


def place(records, grids, reference):
    """{method: {task: Binned}} of the records of the grids' tasks."""
    table = {}
    for record in records:
        grid = grids.get(record.task)
        if grid is None:
            continue
        values = grid.place(record, reference)
        entry = table.setdefault(record.method, {}).setdefault(
            record.task, ([], []))
        entry[0].append(record.seed)
        entry[1].append(values)
    return {method: {task: Binned(seeds, np.stack(values))
                     for task, (seeds, values) in sorted(
                         found.items(), key=lambda x: natural(x[0]))}
            for method, found in table.items()}


def methods(report):
    """[(label, {task: Binned}, is_ours)]: ours first, each published
    method labelled '<method> (published)'."""
    return ([(m, t, True) for m, t in report.ours.items()] +
            [(label(m), t, False) for m, t in report.references.items()])


def label(method):
    """The label of a published method beside ours."""
    return f'{method} (published)'


def compared(report, found):
    """A reference method's tasks restricted to those of ours (all of its
    tasks when there are none of ours)."""
    if not report.ours:
        return found
    tasks = {t for table in report.ours.values() for t in table}
    return {t: v for t, v in found.items() if t in tasks}


def padded(found):
    """{task: values} padded with NaN to the longest grid."""
    width = max(v.values.shape[1] for v in found.values())
    out = {}
    for task, binned in found.items():
        values = binned.values
        if values.shape[1] < width:
            values = np.pad(values, ((0, 0), (0, width - values.shape[1])),
                            constant_values=np.nan)
        out[task] = values
    return out


def compute_stats(report, names):
    every = [(m, compared(report, t)) for m, t, _ in methods(report)]
    every = [(m, t) for m, t in every if t]
    chosen = aggregates.choose(names, report.tasks)
    tables = {m: padded(t) for m, t in every}
    ranges = aggregates.self_ranges(*tables.values())
    for name in chosen:
        report.stats[name] = {}
        for method, table in tables.items():
            try:
                report.stats[name][method] = aggregates.curve(
                    name, table, ranges)
            except ValueError as e:
                report.notes.append(f'{aggregates.title(name)}: {e}')
                report.stats.pop(name)
                break


def last_common_bin(report):
    """The last bin where every method of ours has a score on every one of
    its tasks (where there are none of ours: the band method on its
    tasks), or None."""
    sources = list(report.ours.values()) or [
        report.references.get(report.band, {})]
    best = None
    for found in sources:
        if not found:
            continue
        table = padded(found)
        means = np.stack([np.isfinite(v).any(0) for v in table.values()])
        common = np.flatnonzero(means.all(0))
        if not len(common):
            return None
        best = common[-1] if best is None else min(best, common[-1])
    return None if best is None else int(best)


def normalization(report, normalize):
    """({task: (low, high)} or None, its name)."""
    tasks = report.tasks
    if normalize == 'none':
        return None, ''
    if normalize == 'self':
        tables = [padded(t) for _, t, _ in methods(report) if t]
        return aggregates.self_ranges(*tables), 'self-normalized'
    tables = published.normalization()
    for prefix, name in (('atari_', 'atari57_gamer'), ('dmlab_', 'dmlab30'),
                         ('procgen_', 'procgen_hard')):
        if all(t.startswith(prefix) and t in tables[name] for t in tasks):
            return {t: tables[name][t] for t in tasks}, name
    if all(t.startswith('dmc_') for t in tasks):
        return {t: DMC_RANGE for t in tasks}, 'score / 1000'
    return None, ''


def compute_intervals(report, at, normalize, reps, seed):
    if at:
        index = [int(np.searchsorted(g.xs, at)) for g in report.grids.values()]
        if min(index) >= max(len(g.xs) for g in report.grids.values()):
            last = max(float(g.xs[-1]) for g in report.grids.values())
            raise ValueError(f'--at {at:g} is past the last bin ({last:g}).')
        report.at = min(index)
    else:
        report.at = last_common_bin(report)
    if report.at is None:
        return
    ranges, report.normalized = normalization(report, normalize)
    for method, found, _ in methods(report):
        found = compared(report, found)
        strata = []
        for task, binned in found.items():
            if report.at >= binned.values.shape[1]:
                continue
            values = binned.values[:, report.at]
            values = values[np.isfinite(values)]
            if ranges:
                lo, hi = ranges[task]
                values = (values - lo) / (hi - lo)
            strata.append(values)
        if not any(len(s) for s in strata):
            continue
        report.iqm[method] = Interval(*intervals.bootstrap(
            strata, 'iqm', reps, seed=seed))
        if ranges:
            report.gap[method] = Interval(*intervals.bootstrap(
                strata, 'optimality_gap', reps, seed=seed))


def natural(text):
    """A key that sorts numbers inside names by value."""
    return [int(x) if x.isdigit() else x for x in re.split(r'(\d+)', str(text))]
