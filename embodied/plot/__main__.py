"""python -m embodied.plot LOGDIR [LOGDIR ...]: see `embodied.plot`."""

import argparse
import pathlib
import sys

from embodied import plot
from embodied.plot import bins as binslib
from embodied.plot import intervals


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog='python -m embodied.plot',
        description='Plot episode score against env steps and wall time; '
                    "with --published, over DreamerV3's published runs, "
                    'with the reproduction table and the aggregates.')
    parser.add_argument('logdirs', nargs='*', metavar='LOGDIR',
                        help='a run, or a folder with runs below it (a '
                             'sweep); with --published also a scores file '
                             '(*.json.gz)')
    parser.add_argument('--outdir', default=None,
                        help='where to write (default: the first LOGDIR)')
    parser.add_argument('--name', default=None,
                        help='file name without extension (default: curves, '
                             'with --published bands)')
    parser.add_argument('--label', default=None, metavar='REGEX',
                        help='label runs by the first group of this regex '
                             "in the run's path (default: its parent folder)")
    parser.add_argument('--key', default='episode/score',
                        help='the scores.jsonl column to plot')
    parser.add_argument('--bins', type=int, default=None,
                        help='bins of the env-step axis (default: 30; with '
                             '--published, the published grid, or 30 bins '
                             'of a published file of episodes)')
    parser.add_argument('--spread', choices=('std', 'minmax'), default='std',
                        help='shaded band over the runs of a label')
    parser.add_argument('--episodes', action='store_true',
                        help='also draw each episode as a faint dot')
    parser.add_argument('--hline', type=float, default=None,
                        help='a dashed reference line at this score')
    parser.add_argument('--ymax', type=float, default=None,
                        help='top of the score axis')
    parser.add_argument('--title', default=None)
    band = parser.add_argument_group(
        'published runs (the reproduction table)')
    band.add_argument('--published', nargs='+', default=[],
                      metavar='SUITE_OR_FILE',
                      help="DreamerV3's published runs of a suite ("
                           f"{', '.join(plot.published.SUITES)}; shipped), "
                           'or scores files of any method')
    band.add_argument('--band', default=plot.published.METHOD,
                      help='the published method whose min-max band the '
                           'verdicts use (default: dreamerv3)')
    band.add_argument('--method', default=None,
                      help='the method name of the LOGDIR runs (default: '
                           'from sweep folder names, else ours)')
    band.add_argument('--tasks', default='', metavar='REGEX',
                      help='only the (published) task names it matches')
    band.add_argument('--stats', nargs='+', default=['runs', 'auto'],
                      help='aggregates: auto (the suite\'s), none, or names '
                           f"({', '.join(plot.aggregates.STATS)})")
    band.add_argument('--at', type=float, default=0, metavar='STEP',
                      help='env step of the aggregates table and the '
                           'intervals (default: the last bin with a score '
                           'of ours on every task)')
    band.add_argument('--normalize', choices=('auto', 'self', 'none'),
                      default='auto',
                      help='scores of IQM and optimality gap: auto (the '
                           "suite's table, DMC's 0 to 1000), self, none")
    band.add_argument('--reps', type=int, default=intervals.REPS,
                      help='bootstrap replications')
    band.add_argument('--seed', type=int, default=0,
                      help='seed of the bootstrap')
    band.add_argument('--binsize', type=float, default=0,
                      help='bins of this many env steps for every task')
    band.add_argument('--xlim', type=float, default=0,
                      help='end of the env-step axis (default: our last '
                           'binned score)')
    band.add_argument('--markdown', default=None, metavar='FILE',
                      help='where the markdown table goes (default: '
                           'reproduction.md in the outdir)')
    parser.add_argument('--write', default=None, metavar='FILE.json.gz',
                        help="also write the LOGDIR runs' episodes as a "
                             'scores file')
    args = parser.parse_args(argv)
    try:
        if not args.logdirs and not args.published:
            raise ValueError('Name a LOGDIR, or --published SUITE_OR_FILE.')
        if args.write:
            path = plot.write_scores(args.logdirs, args.write, args.key,
                                     args.method)
            print('Wrote', path)
        if args.published:
            return bands(args)
        paths = plot.plot(
            args.logdirs, args.outdir, args.name or 'curves', args.key,
            args.label, bins=args.bins or binslib.BINS, spread=args.spread,
            episodes=args.episodes, hline=args.hline, ymax=args.ymax,
            title=args.title, ylabel=args.key)
    except (FileNotFoundError, ValueError, ImportError) as e:
        print(f'error: {e}', file=sys.stderr)
        return 2
    for path in paths:
        print('Wrote', path)
    return 0


def bands(args):
    """The runs over the published ones: the table, its markdown, the
    plot."""
    report = plot.compare_runs(
        args.logdirs, args.published, key=args.key, method=args.method,
        band=args.band, task_filter=args.tasks, bins=args.bins or binslib.BINS,
        binsize=args.binsize, stats=args.stats, at=args.at,
        normalize=args.normalize, reps=args.reps, seed=args.seed)
    print(plot.verdict.text(report), end='')
    outdir = args.outdir or (args.logdirs[0] if args.logdirs else None)
    if outdir and pathlib.Path(outdir).name.endswith('.json.gz'):
        outdir = pathlib.Path(outdir).parent
    markdown = args.markdown or (
        pathlib.Path(outdir) / 'reproduction.md' if outdir else None)
    if markdown:
        markdown = pathlib.Path(markdown)
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text(plot.verdict.markdown(report))
        print('Wrote', markdown)
    if outdir:
        try:
            paths = plot.draw_bands(report, outdir, args.name or 'bands',
                                    xlim=args.xlim)
        except ImportError as e:
            print(f'No plot: {e}', file=sys.stderr)
            return 0
        for path in paths:
            print('Wrote', path)
    return 0


if __name__ == '__main__':
    sys.exit(main())
