"""The original's own plot.py reads a sweep folder of ours, and bins and
aggregates it as `embodied.plot` does.

Runs the checkout's `plot.py` (in $EMBODIED_ORIGINAL_DREAMERV3; skipped
otherwise) in a subprocess on synthetic runs in the sweep layout
(`<index>-<task>-<method>-<seed>/scores.jsonl`), through its own functions in
the order its `main` calls them (`load_runs`, `bin_runs`, `print_summary`,
`comp_stats`, `plot_runs`; `main` itself stops in a debugger only for
`--todf`), with its default flags. It needs pandas, tqdm, matplotlib,
ruamel.yaml and elements; the test environment has newer ones than the
original's time (pandas 3, numpy 2, where it pins numpy<2 for DMLab and
MineRL): the test is skipped, naming the module, where one is missing.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from embodied import plot
from embodied.plot import compare
from tests.plot import sweeps

SOURCE = os.environ.get('EMBODIED_ORIGINAL_DREAMERV3', '')
pytestmark = pytest.mark.skipif(
    not SOURCE, reason='EMBODIED_ORIGINAL_DREAMERV3 is not set')

# Its `main` with the flags of its `__main__` block (workers 0: in this
# thread), and what it computed written out as JSON.
DRIVER = r'''
import json, sys
import elements, numpy as np
import plot
sweep, outdir, result = sys.argv[1:]
args = elements.Config(
    pattern='**/scores.jsonl', indirs=[sweep], outdir=outdir, methods='.*',
    tasks='.*', newstyle=True, indir_prefix=False, workers=0,
    xkeys=['xs', 'step'], ykeys=['ys', 'episode/score'], ythres=0.0, xlim=0,
    ylim=0, binsize=0, bins=30, cols=0, legendcols=0, size=[3, 3], xticks=4,
    yticks=10, stats=['runs', 'mean', 'median', 'self_mean', 'self_median'],
    agg=True,
    todf='')
df = plot.load_runs(args)
df = plot.bin_runs(df, args)
plot.print_summary(df)
stats = plot.comp_stats(df, args)
plot.plot_runs(df, stats, args)
listed = lambda x: [None if not np.isfinite(v) else float(v) for v in x]
json.dump({
    'runs': [dict(task=r.task, method=r.method, seed=str(r.seed),
                  xs=listed(r.xs), ys=listed(r.ys)) for r in df.itertuples()],
    'stats': [dict(name=r.name, method=r.method, ys=listed(r.ys))
              for r in stats.itertuples()],
}, open(result, 'w'))
'''
NEEDS = ('pandas', 'tqdm', 'matplotlib', 'ruamel.yaml', 'elements')
# The original's titles of our statistics.
TITLES = {'runs': 'Runs', 'mean': 'Mean', 'median': 'Median',
          'self_mean': 'Self Mean', 'self_median': 'Self Median'}


def test_original_plot_reads_our_sweep_and_agrees(tmp_path):
    for module in NEEDS:
        pytest.importorskip(module, reason=f"the original's plot.py imports {module}")
    sweep = tmp_path / 'sweep'
    # The walker's runs are shorter, so the tasks' bins differ (each task
    # is binned to its own largest step, as the original does); a task
    # with a `-` is written %2D in its folder's name.
    sweeps.write_sweep(sweep, ['dmc_cartpole_balance'], [0, 1, 2])
    sweeps.write_sweep(sweep, ['dmc_walker_walk'], [0, 1, 2], steps=45000,
                       seed=1, start=3)
    sweeps.write_sweep(sweep, ['gym_CartPole-v1'], [0, 1], steps=30000,
                       every=501, seed=2, start=6)
    assert (sweep / '6-gym_CartPole%2Dv1-dreamerv3-0').is_dir()
    result = tmp_path / 'original.json'
    env = dict(os.environ, PYTHONPATH=SOURCE, MPLBACKEND='Agg')
    proc = subprocess.run(
        [sys.executable, '-c', DRIVER, str(sweep), str(tmp_path / 'out'),
         str(result)], cwd=SOURCE, env=env, capture_output=True, text=True,
        timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # What it printed: every task, method and seed of the sweep (the task
    # as its folder spells it: the original does not undo the escape).
    assert ('Tasks (3): dmc_cartpole_balance, dmc_walker_walk, '
            'gym_CartPole%2Dv1') in proc.stdout
    assert 'Methods (1): dreamerv3' in proc.stdout
    assert 'Seeds (3): 0, 1, 2' in proc.stdout
    assert (tmp_path / 'out' / 'sweep' / 'curves.png').stat().st_size > 0
    theirs = json.loads(result.read_text())

    # Ours, on the same folder with no published runs: the original's
    # default grid (30 bins to each task's largest step).
    report = plot.compare_runs(
        [sweep], [], stats=['runs', 'mean', 'median', 'self_mean',
                            'self_median'], reps=100)
    ours = report.ours['dreamerv3']
    assert sorted(ours) == [
        'dmc_cartpole_balance', 'dmc_walker_walk', 'gym_CartPole-v1']
    assert len(theirs['runs']) == 8
    for run in theirs['runs']:
        task = run['task'].replace('%2D', '-')
        binned = ours[task]
        row = binned.seeds.index(int(run['seed']))
        np.testing.assert_allclose(report.grids[task].xs, run['xs'])
        np.testing.assert_allclose(
            binned.values[row], np.array(run['ys'], float), rtol=1e-12)
        assert np.isfinite(binned.values[row]).all()  # an episode a bin
    names = {s['name'] for s in theirs['stats']}
    assert names == set(TITLES.values()), names
    for name, title in TITLES.items():
        stat, = [s for s in theirs['stats'] if s['name'] == title]
        np.testing.assert_allclose(
            report.stats[name]['dreamerv3'], np.array(stat['ys'], float),
            rtol=1e-12, err_msg=name)

