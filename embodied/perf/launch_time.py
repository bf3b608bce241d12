"""Seconds from launch to the first finished train step, first and second
launch, with the persistent compilation cache (and without it).

    python -m embodied.perf.launch_time --configs debug
    python -m embodied.perf.launch_time --configs atari size12m --launches 2

Each launch is `python -m embodied.main --script train` (plus any further
flags) in a fresh process and logdir; it ends at its first train step, once
the device has finished it. All launches of one run share one fresh cache
folder ($EMBODIED_JAX_CACHE), so the first launch compiles and fills it and
later launches load from it; `--no_cache` runs the same launches with the
cache turned off (EMBODIED_JAX_CACHE=off) for comparison.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

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
    args, extra = parser.parse_known_args(argv)
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
    result = subprocess.run(
        [sys.executable, '-c', WORKER, str(start), *flags], cwd=str(ROOT),
        env=env, capture_output=True, text=True, timeout=3600)
    lines = [x for x in result.stdout.splitlines() if x.startswith('RESULT ')]
    if not lines:
        raise RuntimeError(
            f'The launch did not reach a train step (exit '
            f'{result.returncode}):\n{result.stderr[-3000:]}')
    return json.loads(lines[-1][len('RESULT '):])['seconds']


if __name__ == '__main__':
    main()
