"""`python -m embodied.sweep`: the command line of `embodied.sweep`."""

import fcntl
import os
import sys

from embodied.config import UsageError
from embodied.sweep import grid
from embodied.sweep import local
from embodied.sweep import slurm
from embodied.sweep import state

USAGE = """\
python -m embodied.sweep --logdir DIR [--task T ...] [--seed S ...]
    [--grid.KEY V ...] [--sweep.NAME VALUE ...] [flags of embodied.main]

Runs every combination of the tasks, seeds and --grid values as a normal
`python -m embodied.main` run, in DIR/<index>-<task>-<method>-<seed>.
Rerunning the command skips the finished runs and resumes the others.
A key that holds one value, given several (--run.train_ratio 32 64), is
swept as --grid.KEY is. Each value is one word, never split at commas.

Options:
"""


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if {'--help', '-h'} & set(argv):
        print(USAGE + '\n'.join(
            f'  --sweep.{name} (default {default!r}): {meaning}'
            for name, (default, meaning) in grid.OPTIONS.items()), flush=True)
        return 0
    try:
        command = grid.split(argv)
        runs = grid.expand(command)
        sbatch = grid.sbatch_words(command.options)
    except UsageError as e:
        print(f'error: {e}', file=sys.stderr, flush=True)
        return 2
    options = command.options
    sweepdir = runs[0].logdir.parent
    print(f'Sweep of {len(runs)} runs in {sweepdir}.', flush=True)
    say = lambda line: print(line, flush=True)
    if options['dry']:
        for run in runs:
            say(f'  {run.name}: {state.describe(run)[1]}')
        return 0
    if options['scheduler'] == 'slurm':
        try:
            slurm.submit(runs, sweepdir, options['gpus'], sbatch,
                         options['parallel'], say=say)
        except UsageError as e:
            print(f'error: {e}', file=sys.stderr, flush=True)
            return 2
        except RuntimeError as e:
            print(f'error: {e}', file=sys.stderr, flush=True)
            return 1
        return 0
    sweepdir.mkdir(parents=True, exist_ok=True)
    with open(sweepdir / '.sweep.lock', 'a+') as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or 'another process'
            print(f'error: another sweep runs in {sweepdir} ({holder}); '
                  f'wait for it or stop it first.', file=sys.stderr)
            return 2
        lock.truncate(0)
        lock.write(f'pid {os.getpid()}')
        lock.flush()
        return local.run(runs, options['parallel'] or 1, say=say)
