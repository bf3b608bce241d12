"""python -m embodied.plot LOGDIR [LOGDIR ...]: see `embodied.plot`."""

import argparse
import sys

from embodied import plot


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog='python -m embodied.plot',
        description='Plot episode score against env steps and wall time.')
    parser.add_argument('logdirs', nargs='+', metavar='LOGDIR',
                        help='a run, or a folder with runs below it')
    parser.add_argument('--outdir', default=None,
                        help='where to write (default: the first LOGDIR)')
    parser.add_argument('--name', default='curves',
                        help='file name without extension (default: curves)')
    parser.add_argument('--label', default=None, metavar='REGEX',
                        help='label runs by the first group of this regex '
                             "in the run's path (default: its parent folder)")
    parser.add_argument('--key', default='episode/score',
                        help='the scores.jsonl column to plot')
    parser.add_argument('--bins', type=int, default=30)
    parser.add_argument('--spread', choices=('std', 'minmax'), default='std',
                        help='shaded band over the runs of a label')
    parser.add_argument('--episodes', action='store_true',
                        help='also draw each episode as a faint dot')
    parser.add_argument('--hline', type=float, default=None,
                        help='a dashed reference line at this score')
    parser.add_argument('--ymax', type=float, default=None,
                        help='top of the score axis')
    parser.add_argument('--title', default=None)
    args = parser.parse_args(argv)
    try:
        paths = plot.plot(
            args.logdirs, args.outdir, args.name, args.key, args.label,
            bins=args.bins, spread=args.spread, episodes=args.episodes,
            hline=args.hline, ymax=args.ymax, title=args.title,
            ylabel=args.key)
    except (FileNotFoundError, ValueError, ImportError) as e:
        print(f'error: {e}', file=sys.stderr)
        return 2
    for path in paths:
        print('Wrote', path)
    return 0


if __name__ == '__main__':
    sys.exit(main())
