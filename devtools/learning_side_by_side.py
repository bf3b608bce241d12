"""Our runner against the original's, learning side by side on CPU.

    python -m devtools.learning_side_by_side run --outdir DIR \\
        --python_original ORIGINAL_VENV/bin/python --seeds 0 1 2 --jobs 2
    python -m devtools.learning_side_by_side analyze --outdir DIR \\
        --bin 2000 --steps 14000 --plot docs/learning_side_by_side.png

`run` launches, for each seed, the original's `dreamerv3/main.py` (its own
`embodied`, from the checkout in `$EMBODIED_ORIGINAL_DREAMERV3`, run with
`--python_original`, a Python whose packages it works with) and ours
(`python -m embodied.main` from this tree) with the same command line
(`--preset`'s, default `cartpole`, with the seed and the logdir; `--flags`
replaces the preset), `--jobs`
runs at a time in the order original-0, ours-0, original-1, ... (the two
sides of a seed side by side). Each run writes `<outdir>/<side>-<seed>/`
(its logdir, `command.txt`, `stdout.txt`) and a `finished` file when it
exits 0; a rerun skips finished runs.

`analyze` reads each run's `scores.jsonl` (`embodied.plot.runs`), bins the
episode scores by env step (`--bin` steps a bin, up to `--steps`) and
prints each seed's score per bin for both sides as a markdown table
(`--key` and `--file` read another metric, e.g. a loss from
`metrics.jsonl`). It checks the claim: learning starts at the first bin
where either side's seed mean is above its first bin's by `--margin`; from
there on our seeds' min-max must overlap the original's at every bin (in
parentheses: the bins before). The last column is a permutation test's
p-value for equal means of the bin's values of all seeds pooled, each side.
It exits 1 when learning did not start or the ranges part, and draws both
sides' seed mean and min-max on one plot (`--plot`). docs/benchmarks.md
has the results.
"""

import argparse
import os
import pathlib
import shlex
import subprocess
import sys
import time
import warnings

import numpy as np

from embodied.perf import checkout as original

SIDES = ('original', 'ours')

# The command lines both runners know, by name (`--preset`; `--flags`
# replaces them). `cartpole` is the default: gym's CartPole-v1 (the
# original's `gym` suite reads it with gym's old API, ours with gymnasium's),
# where a random policy scores about 22 and the best 500, with the original's
# size1m model at the deter of our `cartpole` block, its batch of 16 x 32,
# its learning rate and warmup, at train ratio 64 (one update of 512 steps
# per 8 env steps, about 1.9k in all): DreamerV3's scores rise from 22 past
# 300 within the first 10k env steps on both sides. The train script with
# its envs in the runner's process (run.debug): on a shared 2-core machine
# the parallel runner's hops between processes for every env step wait on
# the scheduler. `dmc_cartpole_balance`: the original's dmc_proprio block at
# action repeat 4 (env steps are frames; run.steps counts agent steps, as
# both runners do: 2100 are 8.4k frames), 2 envs, batch 8 x 16: within its
# budget the reward loss falls, the score does not rise yet.
COMMON = (
    '--jax.platform cpu --jax.compute_dtype float32 --jax.prealloc False '
    '--logger.outputs jsonl --run.log_every 30 --run.report_every 1e9 '
    '--run.save_every 1e9')
PRESETS = {
    'cartpole': (
        '--configs size1m --task gym_CartPole-v1 --script train '
        '--run.debug True --run.steps 15000 --run.train_ratio 64 '
        '--run.envs 4 --batch_size 16 --batch_length 32 --report_length 16 '
        '--agent.dyn.rssm.deter 256 --agent.opt.lr 1e-4 '
        '--agent.opt.warmup 100 --agent.report False ' + COMMON),
    'dmc_cartpole_balance': (
        '--configs dmc_proprio --task dmc_cartpole_balance --script train '
        '--run.debug True --env.dmc.repeat 4 --run.steps 2100 '
        '--run.train_ratio 64 --run.envs 2 --batch_size 8 --batch_length 16 '
        '--report_length 8 --agent.opt.lr 1e-4 --agent.opt.warmup 100 '
        + COMMON),
}
# The same, with our env ending an episode at the time limit as the
# original's gym adapter does (a termination, not a truncation): the two
# adapters part there, and so do the curves (docs/benchmarks.md).
PRESETS['cartpole_terminal'] = {
    'original': PRESETS['cartpole'],
    'ours': PRESETS['cartpole'].replace(
        '--task gym_CartPole-v1', '--task devtools.cartpole_terminal:CartPole'),
}


def side_flags(flags, side):
    """A preset's command line for `side`: one for both, or one per side."""
    return flags[side] if isinstance(flags, dict) else flags

ROOT = pathlib.Path(__file__).resolve().parent.parent


def command(side, flags, seed, logdir, python_original, checkout):
    """The command line and working directory of one run."""
    args = shlex.split(side_flags(flags, side)) + [
        '--seed', str(seed), '--logdir', str(logdir)]
    if side == 'original':
        main = os.path.join(checkout, 'dreamerv3', 'main.py')
        return [python_original, main] + args, str(logdir.parent)
    return [sys.executable, '-m', 'embodied.main'] + args, str(ROOT)


def environment(side):
    """The run's environment: ours imports this tree; the original its own
    `embodied` (its main.py puts the checkout first on the path)."""
    env = dict(os.environ)
    env.setdefault('MUJOCO_GL', 'egl')
    env.setdefault('LP_NUM_THREADS', '1')  # Mesa's renderer: one thread.
    # One XLA thread: the machine's 2 cores are shared, and more threads
    # than cores slow every run down.
    env.setdefault('XLA_FLAGS', '--xla_cpu_multi_thread_eigen=false '
                   'intra_op_parallelism_threads=1')
    env['JAX_PLATFORMS'] = 'cpu'
    if side == 'ours':
        env['PYTHONPATH'] = str(ROOT)
    else:
        env.pop('PYTHONPATH', None)
    return env


def run(args):
    checkout = original.original_checkout()
    if not checkout or not original.is_worktree(checkout):
        sys.exit(f'error: set ${original.ORIGINAL_ENV} to a work tree of the '
                 f'original dreamerv3 (it runs its own embodied).')
    outdir = pathlib.Path(args.outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    todo = []
    for seed in args.seeds:
        for side in SIDES:
            logdir = outdir / f'{side}-{seed}'
            if (logdir / 'finished').exists():
                print(f'{logdir.name}: finished, skipped')
                continue
            todo.append((side, seed, logdir))
    running = []
    while todo or running:
        while todo and len(running) < args.jobs:
            side, seed, logdir = todo.pop(0)
            logdir.mkdir(parents=True, exist_ok=True)
            flags = args.flags or PRESETS[args.preset]
            cmd, cwd = command(side, flags, seed, logdir,
                               args.python_original, checkout)
            (logdir / 'command.txt').write_text(shlex.join(cmd) + '\n')
            out = open(logdir / 'stdout.txt', 'w')
            proc = subprocess.Popen(
                cmd, cwd=cwd, env=environment(side), stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True)
            print(f'{logdir.name}: started (pid {proc.pid})', flush=True)
            running.append((proc, logdir, out, seed))
        time.sleep(5)
        for item in list(running):
            proc, logdir, out, seed = item
            if proc.poll() is None:
                continue
            out.close()
            running.remove(item)
            if proc.returncode == 0:
                (logdir / 'finished').write_text('')
            print(f'{logdir.name}: exit {proc.returncode}', flush=True)
    return 0


def load_side(outdir, side, key='episode/score', filename='scores.jsonl'):
    """The runs of one side, by seed (`embodied.plot.runs.load`)."""
    from embodied.plot import runs as runslib
    found = {}
    for folder in sorted(pathlib.Path(outdir).glob(f'{side}-*')):
        seed = folder.name.split('-', 1)[1]
        if (folder / filename).exists():
            found[seed] = runslib.load(folder, key, side, filename)
    return found


def bin_scores(runs, width, limit):
    """Each run's mean episode score per bin of `width` env steps up to
    `limit`: an episode counts at the multiple of `width` nearest to the env
    step it ended at (the loggers count a reset record per episode, so
    2 envs' 1000-frame episodes end at 2004 and 2008, not at 2000). Returns
    the bin ends (width, 2 width, ...) and an array (runs, bins), NaN where
    a run ended no episode."""
    bins = int(round(limit / width))
    table = np.full((len(runs), bins), np.nan)
    for i, run in enumerate(runs):
        index = np.round(run.steps / width).astype(int) - 1
        keep = (index >= 0) & (index < bins) & np.isfinite(run.values)
        sums = np.bincount(index[keep], run.values[keep], bins)
        counts = np.bincount(index[keep], None, bins)
        np.divide(sums, counts, out=table[i], where=counts > 0)
    return width * np.arange(1, bins + 1), table


def pooled(runs, width, limit):
    """Per bin (as `bin_scores` bins them), the values of all runs
    together: a list of arrays."""
    bins = int(round(limit / width))
    values = [[] for _ in range(bins)]
    for run in runs:
        index = np.round(run.steps / width).astype(int) - 1
        for i, value in zip(index, run.values):
            if 0 <= i < bins and np.isfinite(value):
                values[i].append(value)
    return [np.asarray(v, float) for v in values]


def permutation_p(a, b, samples=20000, seed=0):
    """Two-sided permutation test of equal means: the fraction of random
    splits of `a` and `b` pooled whose difference of means is at least the
    observed one. NaN when a side is empty."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    if not len(a) or not len(b):
        return np.nan
    observed = abs(a.mean() - b.mean())
    pool = np.concatenate([a, b])
    rng = np.random.default_rng(seed)
    perms = rng.permuted(np.tile(pool, (samples, 1)), axis=1)
    diffs = np.abs(perms[:, :len(a)].mean(1) - perms[:, len(a):].mean(1))
    return float(np.mean(diffs >= observed - 1e-9 * max(1, observed)))


def learning_start(means, margin):
    """The first bin index where any side's seed mean is above that side's
    first bin by more than `margin` (below it by more than -`margin` when
    `margin` is negative, for a loss), or None. `means` is a list of arrays
    (one per side, a value per bin)."""
    hits = []
    for mean in means:
        mean = np.asarray(mean)
        rise = mean - mean[0] if margin >= 0 else mean[0] - mean
        above = np.flatnonzero(rise > abs(margin))
        if len(above):
            hits.append(int(above[0]))
    return min(hits) if hits else None


def overlaps(ours, theirs):
    """Per bin, whether the min-max over runs (rows) of `ours` and of
    `theirs` intersect; False where a side has no value."""
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', RuntimeWarning)  # All-NaN bins.
        lo1, hi1 = np.nanmin(ours, 0), np.nanmax(ours, 0)
        lo2, hi2 = np.nanmin(theirs, 0), np.nanmax(theirs, 0)
    return (lo1 <= hi2) & (lo2 <= hi1)


def analyze(args):
    sides = {side: load_side(args.outdir, side, args.key, args.file)
             for side in SIDES}
    for side, runs in sides.items():
        if not runs:
            sys.exit(f'error: no {side} runs with scores in {args.outdir}')
    limit = args.steps or max(
        run.steps.max() for runs in sides.values() for run in runs.values())
    tables = {}
    for side, runs in sides.items():
        ends, tables[side] = bin_scores(list(runs.values()), args.bin, limit)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', RuntimeWarning)  # All-NaN bins.
        means = [np.nanmean(tables[side], 0) for side in SIDES]
    start = learning_start(means, args.margin)
    inside = overlaps(tables['ours'], tables['original'])
    pools = {side: pooled(list(runs.values()), args.bin, limit)
             for side, runs in sides.items()}
    pvalues = [permutation_p(a, b) for a, b in zip(
        pools['original'], pools['ours'])]
    header = ['env steps']
    for side in SIDES:
        header += [f'{side} seed {seed}' for seed in sides[side]]
        header += [f'{side} mean']
    header += ['min-max overlap', 'p (equal means)']
    lines = ['| ' + ' | '.join(header) + ' |',
             '|' + '---|' * len(header)]
    fmt = lambda x: '-' if not np.isfinite(x) else f'{x:.{args.digits}f}'
    for i, end in enumerate(ends):
        row = [f'{end:,.0f}']
        for side, mean in zip(SIDES, means):
            row += [fmt(x) for x in tables[side][:, i]] + [fmt(mean[i])]
        checked = start is not None and i >= start
        row += [('yes' if inside[i] else '**no**') if checked else
                ('(yes)' if inside[i] else '(no)')]
        row += ['-' if not np.isfinite(pvalues[i]) else f'{pvalues[i]:.2f}']
        lines.append('| ' + ' | '.join(row) + ' |')
    print('\n'.join(lines))
    print()
    if start is None:
        print(f'Learning did not start: no side\'s seed mean of {args.key} '
              f'moved more than {abs(args.margin):g} '
              f'{"above" if args.margin >= 0 else "below"} its first bin.')
        verdict = False
    else:
        bad = [f'{ends[i]:,.0f}' for i in range(start, len(ends))
               if not inside[i]]
        verdict = not bad
        print(f'Learning starts at the bin ending at env step '
              f'{ends[start]:,.0f} (a seed mean of {args.key} more than '
              f'{abs(args.margin):g} {"above" if args.margin >= 0 else "below"}'
              f' its first bin).')
        print('From there on our seeds\' min-max overlaps the original\'s '
              'at every bin.' if verdict else
              f'Our min-max does NOT overlap the original\'s at env steps '
              f'{", ".join(bad)}.')
    if args.plot:
        draw(ends, tables, args.plot, start, args.title, args.key)
        print(f'Wrote {args.plot}')
    return 0 if verdict else 1


def draw(ends, tables, path, start, title, key):
    from embodied.plot import figure, runs as runslib
    plt = figure.pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for index, side in enumerate(SIDES):
        mean, lo, hi = runslib.spread(tables[side], 'minmax')
        keep = np.isfinite(mean)
        color = figure.COLORS[index]
        label = f'{side} ({len(tables[side])} seeds, mean and min-max)'
        ax.plot(ends[keep], mean[keep], color=color, lw=1.5, marker='o',
                ms=2.5, label=label)
        ax.fill_between(ends[keep], lo[keep], hi[keep], color=color,
                        alpha=0.2, lw=0)
    if start is not None:
        ax.axvline(ends[start], color='#999999', lw=1, ls='--')
    ax.set_xlabel('env steps')
    ax.set_ylabel(key)
    ax.set_xlim(left=0)
    ax.grid(color='#eeeeee')
    ax.legend(loc='best', fontsize=8, frameon=False)
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    sub = parser.add_subparsers(dest='mode', required=True)
    p = sub.add_parser('run', help='launch the runs')
    p.add_argument('--outdir', required=True)
    p.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2])
    p.add_argument('--jobs', type=int, default=2,
                   help='runs at a time (in the order original-0, ours-0, '
                        'original-1, ...)')
    p.add_argument('--preset', default='cartpole', choices=sorted(PRESETS),
                   help='the command line of both sides, by name')
    p.add_argument('--flags', default='',
                   help='a command line of your own instead of --preset')
    p.add_argument('--python_original', default='python',
                   help="a Python with the original's dependencies")
    p = sub.add_parser('analyze', help='the table, the verdict and the plot')
    p.add_argument('--outdir', required=True)
    p.add_argument('--bin', type=float, default=2000,
                   help='env steps per bin')
    p.add_argument('--steps', type=float, default=0,
                   help='the last bin\'s end (default: the runs\' last step)')
    p.add_argument('--margin', type=float, default=100,
                   help='the rise above the first bin that counts as '
                        'learning (negative: the fall of a loss below it)')
    p.add_argument('--key', default='episode/score')
    p.add_argument('--file', default='scores.jsonl',
                   help='the runs\' file with --key (metrics.jsonl for a loss)')
    p.add_argument('--plot', default='')
    p.add_argument('--title', default='')
    p.add_argument('--digits', type=int, default=0,
                   help='decimals in the table')
    args = parser.parse_args(argv)
    return run(args) if args.mode == 'run' else analyze(args)


if __name__ == '__main__':
    sys.exit(main())
