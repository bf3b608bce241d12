"""Learning curves of runs, from their `scores.jsonl`.

    python -m embodied.plot LOGDIR [LOGDIR ...] [--outdir DIR] [--label REGEX]

Each LOGDIR is a run, or a folder with runs below it. Runs with the same
label (default: the name of the run's parent folder) are averaged, with the
spread over runs shaded. Draws score against env steps and against wall time
into `curves.png` and `curves.svg`. Needs matplotlib: `pip install
'embodied[plot]'`. The loading and binning (`runs`) need only numpy.
"""

from .runs import Run, binned, find, label_for, load, spread
from .figure import draw

__all__ = ['Run', 'binned', 'draw', 'find', 'label_for', 'load', 'plot',
           'spread']


def plot(logdirs, outdir=None, name='curves', key='episode/score',
         label=None, **kwargs):
    """Finds the runs under `logdirs`, reads `key` from their scores and
    draws them with `draw` into `outdir` (default: the first logdir).
    Returns the paths written."""
    folders = find(logdirs)
    runs = [load(path, key, label_for(path, label)) for path in folders]
    return draw(runs, outdir or logdirs[0], name, **kwargs)
