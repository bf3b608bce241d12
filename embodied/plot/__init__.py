"""Learning curves of runs, from their `scores.jsonl`, and the same runs over
DreamerV3's published ones.

    python -m embodied.plot LOGDIR [LOGDIR ...] [--outdir DIR] [--label REGEX]
    python -m embodied.plot SWEEP --published dmc_proprio

Each LOGDIR is a run, or a folder with runs below it. Runs with the same
label (default: the name of the run's parent folder) are averaged, with the
spread over runs shaded. Draws score against env steps and against wall time
into `curves.png` and `curves.svg`. Needs matplotlib: `pip install
'embodied[plot]'`. The loading and binning (`runs`) need only numpy.

With `--published SUITE` (DreamerV3's runs of a suite, shipped in
`data/`, or any file in the original's scores format, `scores`), every
run is put on the published env-step grid (`bins`, `compare`), each run's
task, method and seed read from its folder's name in the sweep layout
(`folders`), and the command prints the reproduction table (`verdict`):
per task, our seed mean and seeds beside the published min, max and mean at
each published env step, whether our mean is inside that band, and the
paper's aggregates (`aggregates`) with IQM and optimality gap and their
bootstrap intervals (`intervals`). It writes the table as markdown
(`reproduction.md`) and draws `bands.png` and `bands.svg`.
"""

from . import aggregates
from . import bins
from . import compare
from . import folders
from . import intervals
from . import published
from . import scores
from . import tasks
from . import verdict
from .runs import Run, binned, find, label_for, load, spread
from .figure import draw, draw_bands

__all__ = ['Run', 'aggregates', 'binned', 'bins', 'compare', 'compare_runs',
           'draw', 'draw_bands', 'find', 'folders', 'intervals', 'label_for',
           'load', 'plot', 'published', 'scores', 'spread', 'tasks',
           'verdict', 'write_scores']


def plot(logdirs, outdir=None, name='curves', key='episode/score',
         label=None, **kwargs):
    """Finds the runs under `logdirs`, reads `key` from their scores and
    draws them with `draw` into `outdir` (default: the first logdir).
    Returns the paths written."""
    folders_found = find(logdirs)
    runs = [load(path, key, label_for(path, label)) for path in folders_found]
    return draw(runs, outdir or logdirs[0], name, **kwargs)


def compare_runs(inputs, sources=('dmc_proprio',), key='episode/score',
                 method=None, **kwargs):
    """The Report (`compare.build`) of the runs under `inputs` (run
    folders, sweeps or scores files) against the published runs of
    `sources` (suite names of DreamerV3's shipped runs, or scores files);
    `kwargs` go to `compare.build`."""
    ours = folders.read_inputs(inputs, key, method)
    references = [r for source in sources for r in published.load(source)]
    names = ', '.join(
        str(s) if str(s).endswith(scores.SUFFIX) else
        published.path(s).name for s in sources)
    return compare.build(ours, references, source=names, **kwargs)


def write_scores(inputs, path, key='episode/score', method=None):
    """Writes the episodes of the runs under `inputs` as a scores file;
    returns its path."""
    return scores.write(path, folders.read_inputs(inputs, key, method))
