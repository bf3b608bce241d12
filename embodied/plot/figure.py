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
