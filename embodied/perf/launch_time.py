"""Seconds from launch to the first finished train step, first and second
launch, with the persistent compilation cache (and without it).

    python -m embodied.perf.launch_time --configs debug
    python -m embodied.perf.launch_time --configs atari size12m --launches 2

With `--script parallel`, the parallel runner on a cold cache and then on
the warm one: seconds from launch to the first env step and to the first
finished train step, and the agent's compile seconds (its `Compiled the
agent in` line); with `--old REV` the same launches of that git revision's
tree run side by side (alternating, as `throughput --old` does), each tree
with caches of its own. `--quick` is a small run for CI:

    python -m embodied.perf.launch_time --script parallel --old 6e74377 \
        --configs atari size12m --run.envs 4 --run.eval_envs 0
    python -m embodied.perf.launch_time --script parallel --quick

Each launch is `python -m embodied.main --script train` (plus any further
flags) in a fresh process and logdir; it ends at its first train step, once
the device has finished it. All launches of one run share one fresh cache
folder ($EMBODIED_JAX_CACHE), so the first launch compiles and fills it and
later launches load from it; `--no_cache` runs the same launches with the
cache turned off (EMBODIED_JAX_CACHE=off) for comparison. Every launch is
tethered to this command (`core.tether`): killed, even by SIGKILL, it
takes its launch with it.
"""

import argparse
import json
import os
import pathlib
import re
import signal
import statistics
import subprocess
import tempfile
import threading
import time

from embodied.core import tether
from embodied.perf import checkout

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent

# Wraps the agent's train() to report the first finished update, then exit.
WORKER = r'''
import json, os, sys, time
import embodied.jax.agent as agentlib
start = float(sys.argv[1])
train = agentlib.Agent.train
def first_train(self, *args, **kwargs):
    import jax
    result = train(self, *args, **kwargs)
    jax.block_until_ready(result[0])
    print('RESULT ' + json.dumps({'seconds': time.time() - start}), flush=True)
    os._exit(0)
agentlib.Agent.train = first_train
from embodied import main
main.main(sys.argv[2:])
'''


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--configs', nargs='+', default=['debug'])
    parser.add_argument('--launches', type=int, default=2)
    parser.add_argument('--no_cache', action='store_true',
                        help='also launch with the cache turned off')
    parser.add_argument('--script', choices=('train', 'parallel'),
                        default='train')
    parser.add_argument(
        '--old', type=str, default='',
        help='with --script parallel: also launch the tree of this git '
             'revision, side by side')
    parser.add_argument(
        '--rounds', type=int, default=1,
        help='with --script parallel: rounds of cold and warm launches')
    parser.add_argument(
        '--quick', action='store_true',
        help='with --script parallel: the debug config, 2 envs (for CI)')
    parser.add_argument(
        '--timeout', type=float, default=1800,
        help='seconds a parallel launch may take to its first train step')
    args, extra = parser.parse_known_args(argv)
    extra = [x for x in extra if x != '--']
    if args.script == 'parallel':
        return parallel_main(args, extra)
    flags = [
        '--script', 'train', '--configs', *args.configs,
        '--run.log_every', '1e9', *[x for x in extra if x != '--']]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cases = [('cache', '')]
        if args.no_cache:
            cases.append(('no cache', 'off'))
        for name, setting in cases:
            cache = pathlib.Path(tmp) / f'cache{len(rows)}'
            for index in range(args.launches):
                logdir = pathlib.Path(tmp) / f'run{len(rows)}'
                seconds = launch(
                    [*flags, '--logdir', str(logdir)], setting or str(cache))
                size = sum(
                    f.stat().st_size for f in cache.rglob('*') if f.is_file())
                rows.append((name, index + 1, seconds, size))
                print(f'{name}, launch {index + 1}: first train step after '
                      f'{seconds:.1f} s (cache {size / 2 ** 20:.1f} MiB)',
                      flush=True)
    print(f'\nLaunch to first train step, flags: {" ".join(flags)}\n')
    print('| cache | launch | seconds | cache size MiB |')
    print('|---|---|---|---|')
    for name, index, seconds, size in rows:
        print(f'| {name} | {index} | {seconds:.1f} | {size / 2 ** 20:.1f} |')


def launch(flags, cache):
    env = dict(os.environ, PYTHONPATH=str(ROOT), EMBODIED_JAX_CACHE=cache)
    start = time.time()
    result = tether.run(
        ['-c', WORKER, str(start), *flags], cwd=str(ROOT),
        env=env, capture_output=True, text=True, timeout=3600)
    lines = [x for x in result.stdout.splitlines() if x.startswith('RESULT ')]
    if not lines:
        raise RuntimeError(
            f'The launch did not reach a train step (exit '
            f'{result.returncode}):\n{result.stderr[-3000:]}')
    return json.loads(lines[-1][len('RESULT '):])['seconds']



# Wraps the agent's train() to print when the first update has finished, in
# seconds since the process started (as the launcher's `First env step`).
PARALLEL_WORKER = r'''
import os, sys, time
import psutil
import embodied.jax.agent as agentlib
train = agentlib.Agent.train
done = []
def first_train(self, *args, **kwargs):
    import jax
    result = train(self, *args, **kwargs)
    if not done:
        done.append(True)
        jax.block_until_ready(result[0])
        seconds = time.time() - psutil.Process().create_time()
        print(f'LAUNCH_TIME first train step {seconds:.2f} s', flush=True)
    return result
agentlib.Agent.train = first_train
from embodied import main
main.main(sys.argv[1:])
'''

# --quick: the debug config on a vector task, so that the CPU of CI
# compiles and trains no CNN.
QUICK = ['--configs', 'debug', '--task', 'cartpole_balance', '--run.envs',
         '2', '--run.eval_envs', '0', '--run.train_ratio', '32']
PATTERNS = {
    'first_env': r'First env step ([\d.]+) s after launch',
    'first_train': r'LAUNCH_TIME first train step ([\d.]+) s',
    'compile': r'Compiled the agent in ([\d.]+) s',
}
FIGURES = (('first_env', 'first env step s'),
           ('first_train', 'first train step s'), ('compile', 'compile s'))


def parallel_main(args, extra):
    """Cold and warm launches of the parallel runner, per tree and round;
    prints a table (and the ratios with --old)."""
    flags = (QUICK if args.quick else ['--configs', *args.configs]) + [
        '--script', 'parallel', '--run.steps', '1e9',
        '--run.log_every', '1e9', '--run.save_every', '1e9',
        '--run.report_every', '1e9', '--logger.outputs', 'jsonl', *extra]
    results = {}  # (tree, 'cold' or 'warm') -> [figures per round]
    with tempfile.TemporaryDirectory() as tmp:
        trees = checkout.trees(args.old, tmp)
        for index in range(args.rounds):
            order = list(trees.items())
            if index % 2:
                order.reverse()
            for tree, root in order:
                cache = pathlib.Path(tmp) / f'cache-{tree or "work"}-{index}'
                for case in ('cold', 'warm'):
                    logdir = pathlib.Path(tmp) / f'run-{len(results)}-{index}'
                    logdir = f'{logdir}-{case}-{tree or "work"}'
                    measured = launch_parallel(
                        root, [*flags, '--logdir', logdir], cache,
                        args.timeout)
                    results.setdefault((tree, case), []).append(measured)
                    label = f'@{tree}' if tree else 'working tree'
                    print(f'round {index + 1}/{args.rounds} {label}, {case} '
                          f'cache: ' + ', '.join(
                              f'{name} {measured[key]:.1f}'
                              for key, name in FIGURES), flush=True)
    print(f'\nParallel launches, flags: {" ".join(flags)}\n')
    print(parallel_table(results, args.old))
    return 0


def launch_parallel(root, flags, cache, timeout, needed=tuple(PATTERNS),
                    platform='cpu'):
    """One launch of the tree at `root` with the cache folder `cache`,
    ended (its process group killed) once it printed the figures `needed`
    (first env step, first train step, compile time); returns those seconds
    (NaN for one it never printed within `timeout`). With `platform` cpu,
    JAX_PLATFORMS=cpu; else the launch's own setting."""
    path = [str(root), os.environ.get('PYTHONPATH', '')]
    env = {**os.environ, 'PYTHONUNBUFFERED': '1',
           'EMBODIED_JAX_CACHE': str(cache),
           'PYTHONPATH': os.pathsep.join(p for p in path if p)}
    if platform == 'cpu':
        env['JAX_PLATFORMS'] = 'cpu'
    else:
        env.pop('JAX_PLATFORMS', None)
    proc = tether.popen(
        ['-c', PARALLEL_WORKER, *map(str, flags)],
        cwd=str(root), env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    found = {}
    lines = []
    complete = threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line)
            for key, pattern in PATTERNS.items():
                match = re.search(pattern, line)
                if match and key not in found:
                    found[key] = float(match.group(1))
            if all(key in found for key in needed):
                complete.set()
        complete.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        complete.wait(timeout)
    finally:
        tether.end(proc, grace=0)  # Its figures are in: no save needed.
        reader.join(10)
    missing = [key for key in needed if key not in found]
    if missing and (found or proc.returncode not in (None, -signal.SIGKILL)):
        print(f'The launch in {root} ended (exit {proc.returncode}) '
              f'without {", ".join(missing)}; its last lines:\n'
              + ''.join(lines[-40:]), flush=True)
    if 'first_env' not in found and 'first_train' not in found:
        raise RuntimeError(
            f'The launch in {root} reached neither an env step nor a train '
            f'step (exit {proc.returncode}):\n{"".join(lines)[-3000:]}')
    return {key: found.get(key, float('nan')) for key in PATTERNS}


def parallel_table(results, old):
    """The medians per tree and cache, with the ratios working tree / old."""
    median = lambda ms, key: statistics.median(m[key] for m in ms)
    header = '| tree | cache | ' + ' | '.join(n for _, n in FIGURES) + ' |'
    lines = [header, '|' + '---|' * (len(FIGURES) + 2)]
    for (tree, case), measured in sorted(
            results.items(), key=lambda x: (x[0][0] == '', x[0][1])):
        cells = [', '.join(f'{m[key]:.1f}' for m in measured)
                 for key, _ in FIGURES]
        lines.append(f'| {tree or "working tree"} | {case} | '
                     + ' | '.join(cells) + ' |')
    if old:
        for case in ('cold', 'warm'):
            a, b = results.get((old, case)), results.get(('', case))
            if a and b:
                cells = [f'{median(b, key) / median(a, key):.2f}'
                         for key, _ in FIGURES]
                lines.append(f'| ratio (working tree / {old}) | {case} | '
                             + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


if __name__ == '__main__':
    main()
