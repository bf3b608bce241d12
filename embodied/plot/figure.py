"""Learning curves drawn with matplotlib (Agg backend)."""

import pathlib

import numpy as np

from . import runs as runslib

INSTALL = "pip install 'embodied[plot]'"
COLORS = (
    '#0022ff', '#33aa00', '#ff0011', '#ddaa00', '#cc44dd', '#0088aa',
    '#001177', '#117700', '#990022', '#885500', '#553366', '#006666')
AXES = (('steps', 'env steps'), ('times', 'wall time'))


def pyplot():
    """matplotlib.pyplot on the Agg backend, or a clear ImportError."""
    try:
        import matplotlib
    except ImportError:
        raise ImportError(f'Plotting needs matplotlib: {INSTALL}') from None
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    return plt


def draw(runs, outdir, name='curves', bins=30, spread='std', episodes=False,
         ylabel='episode score', title=None, hline=None, ymax=None):
    """Draws score against env steps and against wall time, one curve per
    label (mean over its runs, shaded spread), and writes `name.png` and
    `name.svg` into `outdir`. The wall-time panel is left out when no run
    has a `time` column. Returns the paths written."""
    plt = pyplot()
    labels = list(dict.fromkeys(run.label for run in runs))
    axes = [(attr, text) for attr, text in AXES
            if any(np.isfinite(getattr(run, attr)).any() for run in runs)]
    fig, panels = plt.subplots(
        1, len(axes), figsize=(5 * len(axes), 3.6), squeeze=False)
    for (attr, text), ax in zip(axes, panels[0]):
        scale, unit = (1, '') if attr == 'steps' else _time_unit(runs)
        limit = max(np.nanmax(getattr(run, attr), initial=0) for run in runs)
        for index, label in enumerate(labels):
            group = [run for run in runs if run.label == label]
            color = COLORS[index % len(COLORS)]
            ends, table = runslib.binned(group, attr, bins, limit)
            mean, lo, hi = runslib.spread(table, spread)
            keep = np.isfinite(mean)
            xs = ends / scale
            legend = f'{label} ({len(group)} runs)' if len(group) > 1 else label
            ax.plot(xs[keep], mean[keep], color=color, label=legend, lw=1.5,
                    marker='o', ms=2.5)
            if len(group) > 1:
                ax.fill_between(xs[keep], lo[keep], hi[keep], color=color,
                                alpha=0.2, lw=0)
            if episodes:
                for run in group:
                    ax.scatter(getattr(run, attr) / scale, run.values,
                               s=3, color=color, alpha=0.25, lw=0)
        if hline is not None:
            ax.axhline(hline, color='#999999', lw=1, ls='--')
        ax.set_xlabel(f'{text} ({unit})' if unit else text)
        ax.set_ylabel(ylabel)
        ax.grid(color='#eeeeee')
        ax.set_xlim(left=0)
        if ymax is not None:
            ax.set_ylim(top=ymax)
    panels[0][0].legend(loc='best', fontsize=8, frameon=False)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    outdir = pathlib.Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    paths = [outdir / f'{name}.png', outdir / f'{name}.svg']
    fig.savefig(paths[0], dpi=120)
    fig.savefig(paths[1])
    plt.close(fig)
    return paths


def _time_unit(runs):
    """Seconds, minutes or hours, whichever suits the longest run."""
    longest = max(np.nanmax(run.times) if np.isfinite(run.times).any() else 0
                  for run in runs)
    if longest < 300:
        return 1, 's'
    if longest < 3 * 3600:
        return 60, 'min'
    return 3600, 'h'


def draw_bands(report, outdir, name='bands', xlim=0, cols=4):
    """Each task of a Report (`compare.build`) in a panel of its own: every
    method's seed mean with its min-max over seeds shaded (ours first, then
    the published ones), and a panel per aggregate. The env-step axis ends
    a bin after our last binned score (the whole published grid when there
    are none of ours) unless `xlim` says otherwise. Writes `name.png` and `name.svg`
    into `outdir`; returns their paths."""
    from . import aggregates
    from . import compare
    plt = pyplot()
    every = compare.methods(report)
    colors = {m: COLORS[i % len(COLORS)] for i, (m, _, _) in enumerate(every)}
    xlim = xlim or _band_xlim(report)
    panels = len(report.tasks) + len(report.stats)
    cols = min(cols, panels)
    rows = -(-panels // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 2.8 * rows),
                             squeeze=False)
    axes = axes.flatten()
    for ax in axes[panels:]:
        ax.axis('off')
    for task, ax in zip(report.tasks, axes):
        xs = report.grids[task].xs
        for method, found, ours in every:
            if task not in found:
                continue
            binned = found[task]
            mean = binned.mean()
            low, high = binned.band()
            keep = np.isfinite(mean)
            ax.plot(xs[keep], mean[keep], color=colors[method], lw=1.5,
                    marker='o' if ours else None, ms=2.5,
                    label=f'{method}, {len(binned.seeds)} seeds')
            ax.fill_between(xs[keep], low[keep], high[keep],
                            color=colors[method], alpha=0.2, lw=0)
        ours_name = report.names.get(task, task)
        ax.set_title(task if ours_name == task else f'{task}\n(ours: {ours_name})',
                     fontsize=9)
        _style(ax, xlim)
    grids = list(report.grids.values())
    longest = max(grids, key=lambda g: len(g.xs)).xs if grids else np.zeros(0)
    for stat, ax in zip(report.stats, axes[len(report.tasks):]):
        for method, curve in report.stats[stat].items():
            xs = longest[:len(curve)]
            keep = np.isfinite(curve) & ((curve > 0) if stat == 'runs' else True)
            ours = method in report.ours
            ax.plot(xs[keep], curve[keep], color=colors[method], lw=1.5,
                    marker='o' if ours else None, ms=2.5)
        ax.set_title(aggregates.title(stat), fontsize=9)
        ax.set_facecolor('#f4f4f4')
        _style(ax, xlim)
    handles = {}
    for ax in axes[:len(report.tasks)]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    fig.legend(handles.values(), handles.keys(), loc='lower center',
               ncol=min(4, len(handles)) or 1, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.04 + 0.02 * (len(handles) > 4), 1, 1))
    outdir = pathlib.Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    paths = [outdir / f'{name}.png', outdir / f'{name}.svg']
    fig.savefig(paths[0], dpi=120)
    fig.savefig(paths[1])
    plt.close(fig)
    return paths


def _band_xlim(report):
    """The label of our last binned score over all tasks plus one bin, or 0
    (the whole grid) when there are none of ours."""
    last = 0.0
    for found in report.ours.values():
        for task, binned in found.items():
            scored = np.flatnonzero(np.isfinite(binned.mean()))
            if len(scored):
                edges = report.grids[task].edges
                last = max(last, float(edges[scored[-1] + 1]) + float(
                    edges[1] - edges[0]))
    return last


def _style(ax, xlim):
    from matplotlib import ticker
    ax.grid(color='#dddddd')
    ax.tick_params(labelsize=8)
    ax.set_xlim(0, xlim or None)
    ax.xaxis.set_major_locator(ticker.MaxNLocator(4))
    ax.xaxis.set_major_formatter(lambda x, _: _short(x))
    ax.set_xlabel('env steps', fontsize=8)


def _short(x):
    """1500 -> 1.5K, 2e6 -> 2M."""
    for scale, suffix in ((1e9, 'B'), (1e6, 'M'), (1e3, 'K')):
        if abs(x) >= scale:
            return f'{x / scale:.4g}{suffix}'
    return f'{x:.4g}'
