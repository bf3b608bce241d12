"""Runs put on one env-step grid, binned as the original's plot.py bins them.

A grid's bins are `[0, d), [d, 2d), ...` up to the last x (numpy's
histogram: the last bin also holds its right edge), each labelled by its
right edge and valued by the mean of the episodes inside it (NaN where
none). A published file that is binned already (every run's xs evenly
spaced at one step `d`, on multiples of it, as `dmc_proprio`'s 10k-step
bins) gives its own grid, and its values stay as published; otherwise the
grid has `bins` bins (the original's default 30) from 0 to the task's
largest x, and the published runs are binned on it like ours. Our runs
(episodes) are always binned.
"""

import dataclasses

import numpy as np

BINS = 30


@dataclasses.dataclass
class Grid:
    """Bin edges, and whether the runs that gave them were binned on them
    already (their values are then taken as they are)."""

    edges: np.ndarray
    prebinned: bool = False

    @property
    def xs(self):
        """Each bin's label: its right edge."""
        return self.edges[1:]

    def bin(self, xs, ys):
        """The mean of `ys` in each bin of `xs` (NaN where a bin is empty)."""
        xs, ys = np.asarray(xs, float), np.asarray(ys, float)
        keep = np.isfinite(xs) & np.isfinite(ys)
        sums = np.histogram(xs[keep], self.edges, weights=ys[keep])[0]
        counts = np.histogram(xs[keep], self.edges)[0]
        return np.divide(sums, counts, out=np.full(len(self.xs), np.nan),
                         where=counts > 0)

    def align(self, xs, ys):
        """Values already binned on this grid, at its labels (NaN where a
        run has none; values off the labels, such as one at x = 0, are
        left out)."""
        out = np.full(len(self.xs), np.nan)
        index = np.searchsorted(self.xs, xs)
        inside = index < len(self.xs)
        on = inside.copy()
        on[inside] = np.isclose(self.xs[index[inside]], np.asarray(xs)[inside])
        out[index[on]] = np.asarray(ys, float)[on]
        return out

    def place(self, record, reference=False):
        """A record's values on this grid: a published record of a
        prebinned grid whose xs all lie on its labels (or at or below 0) is
        aligned, any other record binned."""
        if reference and self.prebinned and self.on_labels(record.xs):
            return self.align(record.xs, record.ys)
        return self.bin(record.xs, record.ys)

    def on_labels(self, xs):
        xs = np.asarray(xs, float)
        xs = xs[xs > 0]
        index = np.clip(np.searchsorted(self.xs, xs), 0, len(self.xs) - 1)
        return bool(np.isclose(self.xs[index], xs).all())

def spacing(records):
    """The common step of records whose xs are evenly spaced at one step,
    on multiples of it, or None."""
    steps = set()
    for record in records:
        xs = record.xs
        if len(xs) < 2:
            return None
        diffs = np.diff(xs)
        if not np.allclose(diffs, diffs[0]) or diffs[0] <= 0:
            return None
        steps.add(float(diffs[0]))
        if len(steps) > 1 or not np.allclose(xs / diffs[0], np.round(xs / diffs[0])):
            return None
    return steps.pop() if steps else None


def grid(records, bins=BINS, binsize=0, xlim=0, prebinned=True):
    """The grid of one task's `records`: their own bins when `prebinned`
    allows and they are binned already, else `bins` bins (or bins of
    `binsize`) from 0 to `xlim` (default: their largest x)."""
    xlim = xlim or max(float(np.nanmax(r.xs)) for r in records if len(r.xs))
    step = spacing(records) if prebinned and not binsize else None
    if step:
        return Grid(np.arange(0, xlim + 0.99 * step, step), prebinned=True)
    size = binsize or xlim / bins
    return Grid(np.arange(0, xlim + 0.99 * size, size))
