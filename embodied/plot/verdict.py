"""The reproduction verdict of a Report (`compare.build`), as a terminal
table and as markdown to paste into an issue.

Per task and method of ours: at each published env step up to our last
binned score, our seed mean and each seed's score beside the band method's
published min, max and mean over its seeds, and whether our mean is
`inside` the band (min <= mean <= max), `below` or `above` it. A task's
verdict counts the steps where both have a score and says where the last
one falls. Then the aggregates at one env step, each method a column.
"""

import dataclasses
import math

import numpy as np

from . import aggregates
from . import compare
from . import intervals


@dataclasses.dataclass
class Row:
    step: float
    mean: float
    seeds: list
    low: float
    high: float
    published: float
    mark: str


@dataclasses.dataclass
class TaskVerdict:
    """One task of one method of ours against the band."""

    method: str
    task: str
    seeds: list
    rows: list
    reference_seeds: int

    @property
    def compared(self):
        return [r for r in self.rows if r.mark]

    @property
    def inside(self):
        return sum(r.mark == 'inside' for r in self.compared)

    @property
    def last(self):
        return self.compared[-1] if self.compared else None


def mark(mean, low, high):
    """'inside', 'below' or 'above' the band; '' where either side has no
    score."""
    if not all(math.isfinite(x) for x in (mean, low, high)):
        return ''
    if mean < low:
        return 'below'
    if mean > high:
        return 'above'
    return 'inside'


def verdicts(report):
    """A TaskVerdict for each method and task of ours."""
    found = []
    for method, tasks in report.ours.items():
        for task, ours in tasks.items():
            grid = report.grids[task]
            band = report.references.get(report.band, {}).get(task)
            mean = ours.mean()
            if band is not None:
                low, high = band.band()
                published = band.mean()
            else:
                low = high = published = np.full(len(grid.xs), np.nan)
            scored = np.flatnonzero(np.isfinite(mean))
            rows = []
            for i in range(int(scored[-1]) + 1 if len(scored) else 0):
                if not (np.isfinite(mean[i]) or np.isfinite(published[i])):
                    continue
                rows.append(Row(
                    float(grid.xs[i]), float(mean[i]),
                    [float(x) for x in ours.values[:, i]], float(low[i]),
                    float(high[i]), float(published[i]),
                    mark(mean[i], low[i], high[i])))
            found.append(TaskVerdict(
                method, task, list(ours.seeds), rows,
                0 if band is None else len(band.seeds)))
    return found


def score(value):
    if value is None or not math.isfinite(value):
        return '-'
    return f'{value:.0f}' if abs(value) >= 1000 else f'{value:.1f}'


def stat(value, name=''):
    if value is None or not math.isfinite(value):
        return '-'
    if name == 'runs':
        return f'{value:.0f}'
    return f'{value:.3f}' if abs(value) < 10 else f'{value:.1f}'


def step(value):
    return f'{value:.0f}'


def summary(verdict):
    """'inside the band at 3 of 4 steps; at the last, 40000: inside'."""
    if not verdict.reference_seeds:
        return 'no published runs of this task'
    if not verdict.compared:
        return 'no step where both have a score yet'
    last = verdict.last
    return (f'inside the band at {verdict.inside} of {len(verdict.compared)} '
            f'steps; at the last, {step(last.step)}: {last.mark}')


def task_title(report, verdict):
    ours = report.names.get(verdict.task, verdict.task)
    name = verdict.task if ours == verdict.task else f'{verdict.task} (ours: {ours})'
    return (f'{name}: {verdict.method} ({len(verdict.seeds)} seeds: '
            f'{" ".join(str(s) for s in verdict.seeds)}) against '
            f'{report.band} ({verdict.reference_seeds} seeds, '
            f'{report.source or "published"})')


def row_cells(row):
    return [step(row.step), score(row.mean),
            ' '.join(score(x) for x in row.seeds), score(row.low),
            score(row.high), score(row.published), row.mark or '-']


def headers(report):
    return ['env step', 'ours mean', 'ours seeds', 'published min',
            'published max', 'published mean', 'verdict']


def aggregate_rows(report):
    """[(title, {method: text})] at the report's bin."""
    if report.at is None:
        return []
    rows = []
    for name, curves in report.stats.items():
        rows.append((aggregates.title(name), {
            m: stat(c[report.at] if report.at < len(c) else np.nan, name)
            for m, c in curves.items()}))
    scale = f', {report.normalized}' if report.normalized else ''
    size = f'{intervals.SIZE:.0%} CI'
    for label, found in ((f'IQM ({size}{scale})', report.iqm),
                         (f'Optimality Gap ({size}{scale})', report.gap)):
        if found:
            rows.append((label, {
                m: f'{stat(v.point)} [{stat(v.low)}, {stat(v.high)}]'
                for m, v in found.items()}))
    return rows


def method_names(report):
    return [m for m, _, _ in compare.methods(report)]


def table(cells, align):
    """Cells laid out in columns; align: 'l' or 'r' per column."""
    widths = [max(len(row[i]) for row in cells) for i in range(len(align))]
    lines = []
    for row in cells:
        parts = [c.ljust(w) if a == 'l' else c.rjust(w)
                 for c, w, a in zip(row, widths, align)]
        lines.append('  '.join(parts).rstrip())
    return lines


def text(report):
    """The verdict as terminal text."""
    lines = []
    found = verdicts(report)
    for verdict in found:
        lines.append(task_title(report, verdict))
        if verdict.rows:
            cells = [headers(report)] + [row_cells(r) for r in verdict.rows]
            lines.extend('  ' + x for x in table(cells, 'rrlrrrl'))
        lines.append('  ' + summary(verdict))
        lines.append('')
    rows = aggregate_rows(report)
    if rows:
        methods = method_names(report)
        lines.append(f'Aggregates at env step {step(report.at_step())} '
                     f'(tasks: {len(report.tasks)}):')
        cells = [['statistic', *methods]] + [
            [title, *(values.get(m, '-') for m in methods)]
            for title, values in rows]
        lines.extend('  ' + x for x in table(cells, 'l' + 'r' * len(methods)))
        lines.append('')
    if found:
        lines.append('Verdict:')
        cells = [['task', 'method', 'seeds', 'inside the band', 'last step',
                  'at the last step']] + [summary_cells(v) for v in found]
        lines.extend('  ' + x for x in table(cells, 'llrrrl'))
        lines.append('  ' + overall(found))
    lines.extend(report.notes)
    return '\n'.join(lines).rstrip() + '\n'


def summary_cells(verdict):
    last = verdict.last
    return [verdict.task, verdict.method, str(len(verdict.seeds)),
            f'{verdict.inside}/{len(verdict.compared)}',
            step(last.step) if last else '-', last.mark if last else '-']


def overall(found):
    """One line: the tasks whose last compared step is inside the band."""
    judged = [v for v in found if v.last]
    inside = sum(v.last.mark == 'inside' for v in judged)
    steps = sum(len(v.compared) for v in found)
    return (f'{inside} of {len(judged)} tasks inside the band at their last '
            f'step; {sum(v.inside for v in found)} of {steps} steps inside.')


def markdown(report):
    """The verdict as markdown: the summary, each task's rows, the
    aggregates."""
    found = verdicts(report)
    lines = [f'## Reproduction against {report.band} '
             f'({report.source or "published"})', '']
    if found:
        lines += ['| task | method | seeds | inside the band | last step | '
                  'at the last step |', '|---|---|---:|---:|---:|---|']
        lines += ['| ' + ' | '.join(summary_cells(v)) + ' |' for v in found]
        lines += ['', overall(found), '']
    rows = aggregate_rows(report)
    if rows:
        methods = method_names(report)
        lines += [f'### Aggregates at env step {step(report.at_step())}', '',
                  '| statistic | ' + ' | '.join(methods) + ' |',
                  '|---|' + '---:|' * len(methods)]
        lines += ['| ' + ' | '.join([title, *(v.get(m, '-') for m in methods)])
                  + ' |' for title, v in rows]
        lines.append('')
    for verdict in found:
        lines += [f'### {task_title(report, verdict)}', '']
        if verdict.rows:
            lines += ['| ' + ' | '.join(headers(report)) + ' |',
                      '|---:|---:|---|---:|---:|---:|---|']
            lines += ['| ' + ' | '.join(row_cells(r)) + ' |'
                      for r in verdict.rows]
            lines.append('')
        lines += [summary(verdict), '']
    lines += [f'- {note}' for note in report.notes]
    return '\n'.join(lines).rstrip() + '\n'
