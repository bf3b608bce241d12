"""Exit soak: a run whose caller goes away, many times over, counting
the runs that did not stop, save and exit in time, and what they left.

    python -m devtools.exit_soak                       # 10 repeats each
    python -m devtools.exit_soak --repeats 50 --scenarios tool_killed

Two scenarios, each repeated `--repeats` times in fresh folders (a race
shows in a few of N, never in one):

* `pipe_closes`: `python -m embodied.run.parallel` (random agent,
  `--configs debug`, 2 envs, `run.duration` 600 s) with its stdout on a
  pipe; the reader closes the pipe after the first `[Progress]` line. The
  run must stop, save and exit 0 within `BOUND` seconds, leave no process,
  and say why in its logdir's `broken_pipe.log`. It alternates between
  three variants: stderr on the same pipe; stderr in a file of its own
  (where the line that says why must appear too); both on the pipe without
  PYTHONUNBUFFERED (block-buffered streams).
* `tool_killed`: `python -m embodied.perf.throughput` (one row: random
  agent, 2 envs, `--seconds` 60) SIGKILLed once its run writes metrics. No
  process of the run may be left `BOUND` seconds later (the run's tether
  sends SIGTERM, then SIGKILL after `core.tether.GRACE`), the run must
  have saved after the kill (it stopped in order rather than by the
  SIGKILL), and its `broken_pipe.log` must say so.

A run still alive at the bound is dumped with py-spy when it is on PATH
(`pip install py-spy`), then killed. Prints one row per repeat and a
summary; exits 1 unless every repeat passed.
"""

import argparse
import collections
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import psutil

ROOT = pathlib.Path(__file__).resolve().parent.parent
BOUND = 90  # Seconds: the stop's own (a few at debug size), above GRACE.
RUN = ('--script', 'parallel', '--configs', 'debug', '--task', 'dummy_disc',
       '--random_agent', 'True', '--run.envs', '2', '--run.eval_envs', '0',
       '--run.log_every', '1', '--run.steps', '1e9', '--run.duration', '600',
       '--logger.outputs', 'jsonl')
PIPE_VARIANTS = (
    dict(split=False, buffered=False), dict(split=True, buffered=False),
    dict(split=False, buffered=True))


def env(buffered=False):
    result = dict(os.environ, JAX_PLATFORMS='cpu')
    result['PYTHONPATH'] = os.pathsep.join(
        p for p in (str(ROOT), result.get('PYTHONPATH', '')) if p)
    result.pop('PYTHONUNBUFFERED', None)
    if not buffered:
        result['PYTHONUNBUFFERED'] = '1'
    return result


def pipe_closes(folder, split=False, buffered=False, bound=BOUND):
    """One run whose stdout pipe closes after its first progress line;
    what happened: exit code, seconds from the close to the exit, the
    processes left, the save tags before and after, the logdir's
    `broken_pipe.log` and (with `split`) what stderr got."""
    folder = pathlib.Path(folder)
    logdir = folder / 'run'
    errors = folder / 'stderr.txt'
    read, write = os.pipe()
    with open(errors, 'w') as err:
        proc = subprocess.Popen(
            [sys.executable, '-m', 'embodied.run.parallel', *RUN,
             '--logdir', str(logdir)], cwd=ROOT, env=env(buffered),
            stdout=write, stderr=err if split else write,
            start_new_session=True)
    os.close(write)
    lines = []
    with os.fdopen(read, errors='replace') as pipe:
        for line in pipe:
            lines.append(line)
            if line.startswith('[Progress]'):
                break
        tree = _tree(proc.pid)
        before = saved_tags(logdir)
        closed = time.monotonic()
    code, left = _wait(proc, tree, closed + bound)
    seconds = time.monotonic() - closed
    return dict(
        exit=code, seconds=seconds, left=left, before=before, split=split,
        after=saved_tags(logdir), log=_read(logdir / 'broken_pipe.log'),
        stderr=_read(errors), output=''.join(lines))


def tool_killed(folder, seconds=60, bound=BOUND):
    """One throughput run, its tool SIGKILLed once the run writes metrics;
    what happened: seconds from the kill until no process of the run was
    left (None: some were left at `bound`, listed in `left`), the save
    tags before and after, the run's `broken_pipe.log`."""
    folder = pathlib.Path(folder)
    scratch = folder / 'tmp'
    scratch.mkdir(parents=True)
    with open(folder / 'tool.txt', 'w') as out:
        tool = subprocess.Popen(
            [sys.executable, '-m', 'embodied.perf.throughput', '--skip_agent',
             '--envs', '2', '--per_worker', '1', '--seconds', str(seconds)],
            cwd=ROOT, env={**env(), 'TMPDIR': str(scratch)}, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 300
    logdir = None
    while logdir is None or not (logdir / 'metrics.jsonl').exists():
        if tool.poll() is not None or time.monotonic() > deadline:
            _kill_group(tool.pid)
            raise RuntimeError(
                f'The tool ended ({tool.poll()}) or its run wrote no metrics '
                f'within 300 s:\n{_read(folder / "tool.txt")[-2000:]}')
        found = list(scratch.glob('*/run'))
        logdir = found[0] if found else None
        time.sleep(0.1)
    tree = _tree(tool.pid)
    groups = {os.getpgid(p.pid) for p in tree if _alive(p)} - {tool.pid}
    before = saved_tags(logdir)
    tool.kill()
    tool.wait()
    killed = time.monotonic()
    left = tree
    while left and time.monotonic() < killed + bound:
        time.sleep(0.1)
        left = [p for p in tree if _alive(p)] + _in_groups(groups)
    gone = None if left else time.monotonic() - killed
    pids = sorted({p.pid for p in left})
    if pids:
        _dump(pids[0])
        for pid in pids:
            _kill(pid)
    return dict(
        seconds=gone, left=pids, before=before, after=saved_tags(logdir),
        log=_read(logdir / 'broken_pipe.log'), groups=sorted(groups))


def check_pipe(result):
    """The problems with a `pipe_closes` result ([] when it passed)."""
    problems = []
    if result['exit'] != 0:
        problems.append(f'exit {result["exit"]}')
    if result['left']:
        problems.append(f'left {result["left"]}')
    if not [t for t in result['after'] if t not in result['before']]:
        problems.append(f'no save after the close ({result["after"]})')
    log = result['log']
    for needed in (r'lost (its|their) reader', r'at step \d+: saving and '
                   r'stopping', 'All workers exited'):
        if not re.search(needed, log):
            problems.append(f'broken_pipe.log lacks {needed!r}')
    if result['split'] and 'lost its reader' not in result['stderr']:
        problems.append('stderr does not say why')
    if 'Traceback' in log + result['stderr']:
        problems.append('a traceback')
    return problems


def check_tool(result):
    """The problems with a `tool_killed` result ([] when it passed)."""
    problems = []
    if result['seconds'] is None:
        problems.append(f'left {result["left"]} at the bound')
    if not [t for t in result['after'] if t not in result['before']]:
        problems.append(f'no save after the kill ({result["after"]})')
    for needed in ('Received SIGTERM', 'All workers exited.'):
        if needed not in result['log']:
            problems.append(f'broken_pipe.log lacks {needed!r}')
    return problems


def saved_tags(logdir):
    """The agent's complete save tags in `logdir`."""
    folder = pathlib.Path(logdir) / 'ckpt' / 'agent'
    if not folder.exists():
        return []
    return sorted(int(p.name) for p in folder.iterdir()
                  if p.name.isdigit() and (p / 'done').exists())


def _tree(pid):
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _alive(proc):
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _in_groups(groups):
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) in groups and _alive(proc):
                found.append(proc)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    return found


def _wait(proc, tree, deadline):
    """(exit code or 'hung', processes of `tree` left) by `deadline`."""
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    code = proc.poll()
    if code is None:
        _dump(proc.pid)
        code = 'hung'
    settle = time.monotonic() + 5  # Children see their parent go.
    left = [p for p in tree if _alive(p)]
    while left and time.monotonic() < settle:
        time.sleep(0.05)
        left = [p for p in tree if _alive(p)]
    _kill_group(proc.pid)
    for p in left:
        _kill(p.pid)
    proc.wait()
    return code, sorted(p.pid for p in left)


def _dump(pid):
    spy = shutil.which('py-spy')
    if spy:
        subprocess.run([spy, 'dump', '--pid', str(pid)], timeout=60)


def _kill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _kill_group(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _read(path):
    path = pathlib.Path(path)
    return path.read_text(errors='replace') if path.exists() else ''


def _pipe(folder, index):
    variant = PIPE_VARIANTS[index % len(PIPE_VARIANTS)]
    result = pipe_closes(folder, **variant)
    name = ('stderr apart' if variant['split'] else 'stderr on it') + (
        ', buffered' if variant['buffered'] else '')
    return name, result['seconds'], check_pipe(result)


def _tool(folder, index):
    result = tool_killed(folder)
    return 'SIGKILL', result['seconds'], check_tool(result)


# Each: (folder, repeat) -> (variant, seconds to the end, problems).
SCENARIOS = {'pipe_closes': _pipe, 'tool_killed': _tool}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--repeats', type=int, default=10)
    parser.add_argument('--scenarios', nargs='+', default=list(SCENARIOS),
                        choices=list(SCENARIOS))
    parser.add_argument('--keep', action='store_true',
                        help='keep every folder (else only failed ones)')
    args = parser.parse_args(argv)
    folder = pathlib.Path(tempfile.mkdtemp(prefix='exit_soak-'))
    print('Seconds: from the pipe\'s close to the exit, or from the kill '
          'until no process of the run was left.', flush=True)
    print('| scenario | repeat | variant | seconds | load before | '
          'problems |', flush=True)
    print('|---|---|---|---|---|---|', flush=True)
    failed = collections.Counter()
    seconds = collections.defaultdict(list)
    for index in range(args.repeats):
        for name in args.scenarios:
            where = folder / f'{name}-{index}'
            where.mkdir()
            load = os.getloadavg()[0]
            try:
                variant, took, problems = SCENARIOS[name](where, index)
            except Exception as e:  # Reported; the soak goes on.
                variant, took = '?', None
                problems = [f'{type(e).__name__}: {e}'.splitlines()[0]]
            failed[name] += bool(problems)
            if took is not None:
                seconds[name].append(took)
            shown = '-' if took is None else f'{took:.1f}'
            print(f'| {name} | {index} | {variant} | {shown} | {load:.1f} | '
                  f'{"; ".join(problems) or "-"} |', flush=True)
            if not problems and not args.keep:
                shutil.rmtree(where, ignore_errors=True)
    print()
    for name in args.scenarios:
        took = sorted(seconds[name])
        spread = (f'; seconds median {took[len(took) // 2]:.1f}, max '
                  f'{took[-1]:.1f}' if took else '')
        print(f'{name}: {args.repeats - failed[name]} of {args.repeats} '
              f'passed{spread}.', flush=True)
    if args.keep or any(failed.values()):
        print(f'Folders: {folder}', flush=True)
    else:
        shutil.rmtree(folder, ignore_errors=True)
    return 1 if any(failed.values()) else 0


if __name__ == '__main__':
    sys.exit(main())
