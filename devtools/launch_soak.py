"""Launch soak: the same command started N times in a row, each in a fresh
logdir, counting exit codes and error lines.

    python -m devtools.launch_soak                            # 10 launches
    python -m devtools.launch_soak --launches 20 -- \\
        --script parallel --configs debug --run.steps 600

A failure that depends on timing (two threads racing at start-up, a role
slow to come up on a busy machine) shows in a few launches of N, never in
one. The default command is the design card's: `python -m
embodied.run.parallel --script parallel --configs debug --run.steps 600`.
Prints one row per launch (exit code, wall seconds, error lines, the first
of them) and a summary; the load average before and after each launch says
how busy the machine was. Exits 1 unless every launch exited 0.
"""

import argparse
import collections
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT = ('--script', 'parallel', '--configs', 'debug', '--run.steps', '600')
# Lines that report a failure (tracebacks, role errors, exceptions).
ERROR = re.compile(
    r'Traceback|Error in method|Error:|Exception|ended unexpectedly|'
    r'exit code [1-9]')


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--launches', type=int, default=10)
    parser.add_argument('--timeout', type=float, default=900)
    parser.add_argument('--module', default='embodied.run.parallel')
    parser.add_argument('--keep', action='store_true',
                        help='keep the logdirs and logs (printed at the end)')
    parser.add_argument('flags', nargs='*', help='the command\'s flags '
                        '(after --); default: ' + ' '.join(DEFAULT))
    args = parser.parse_args(argv)
    flags = args.flags or list(DEFAULT)
    folder = pathlib.Path(tempfile.mkdtemp(prefix='launch_soak-'))
    print(f'Command: python -m {args.module} {" ".join(flags)}', flush=True)
    print('| launch | exit | wall s | load before | load after | '
          'error lines | first error |', flush=True)
    print('|---|---|---|---|---|---|---|', flush=True)
    results = []
    for index in range(args.launches):
        result = launch(args.module, flags, folder / f'run{index}',
                        args.timeout)
        results.append(result)
        print(f'| {index} | {result["exit"]} | {result["wall"]:.1f} | '
              f'{result["load_before"]:.1f} | {result["load_after"]:.1f} | '
              f'{len(result["errors"])} | '
              f'{result["errors"][0][:120] if result["errors"] else ""} |',
              flush=True)
    codes = collections.Counter(r['exit'] for r in results)
    ok = codes.get(0, 0)
    print(f'\n{ok} of {len(results)} launches exited 0; exit codes '
          f'{dict(sorted(codes.items(), key=str))}; error lines in '
          f'{sum(bool(r["errors"]) for r in results)} launches.', flush=True)
    if args.keep:
        print(f'Logs and logdirs: {folder}')
    else:
        _remove(folder)
    return 0 if ok == len(results) else 1


def launch(module, flags, logdir, timeout):
    """Runs the command once to its end; its exit code ('timeout' when it
    ran past `timeout` seconds), wall time and error lines."""
    logdir.mkdir(parents=True)
    env = dict(os.environ, PYTHONUNBUFFERED='1')
    env['PYTHONPATH'] = os.pathsep.join(
        [str(ROOT), env.get('PYTHONPATH', '')])
    command = [sys.executable, '-m', module, *flags, '--logdir', str(logdir)]
    load_before = os.getloadavg()[0]
    start = time.monotonic()
    with open(logdir / 'output.log', 'w') as output:
        try:
            code = subprocess.run(
                command, cwd=ROOT, env=env, stdout=output,
                stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            code = 'timeout'
    wall = time.monotonic() - start
    lines = (logdir / 'output.log').read_text(errors='replace').splitlines()
    errors = [line.strip() for line in lines if ERROR.search(line)]
    return dict(exit=code, wall=wall, errors=errors, load_before=load_before,
                load_after=os.getloadavg()[0])


def _remove(folder):
    import shutil
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == '__main__':
    sys.exit(main())
