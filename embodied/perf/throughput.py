"""Throughput benchmark of the parallel runner against single-process train.

    python -m embodied.perf.throughput                 # the full table
    python -m embodied.perf.throughput --envs 4 16 --per_worker 1 4 \\
        --agent 16x8 --seconds 30 --train_ratio 32 --markdown table.md

Rows:

* `parallel`, random agent (`--random_agent True --configs debug --task
  dummy_disc --run.eval_envs 0`), for every `--envs` x `--per_worker`.
* `parallel` and `train` (single process) with the numpy test agent at
  `--train_ratio`, for each `--agent` setting (envs and envs per worker
  process; `train` steps as many envs in its one process).

* With `--dreamer`, `parallel` with DreamerV3 at `debug` (`--agent_impl
  dreamerv3`) for each `--agent` setting.

Columns: env steps/s and train steps/s after the first env step, mean policy
batch latency (first request of a batch waiting to the reply), CPU seconds of
the whole process tree per env step, and seconds from launch to the first env
step. Each run is a command in its own logdir, stopped by `run.duration`, and
tethered to this one (`core.tether`): killed, even by SIGKILL, this tool
takes its run with it.
The env steps/s of the summary count the seconds of the final save and
stop too, and the CPU per env step every process's start (imports), the
final save and the stop; parallel rows also give the steady env steps/s and
the steady CPU per env step, from the first progress line to the stop
decision (read off the output as it comes; the CPU of the process tree,
polled 4 times a second, interpolated to those moments).

Side by side with a git revision (`--old REV`, e.g. `--old ebfdc8b`): the
revision's tree is exported to a temporary folder and every row runs there
and here, one after the other, in `--rounds` rounds (the order alternates
from round to round, so that other load hits both alike). Each round prints
its figures; the table gives per row the figures of every round and the
ratio of the medians (working tree / REV; the steady env steps/s at the
end of each row), and a second table the CPU per
env step of each process of the parallel runs (launcher, agent, replay,
logger, env workers; named by the pids the launcher prints):

    python -m embodied.perf.throughput --old ebfdc8b --rounds 3 \\
        --envs 16 --per_worker 1 8 --skip_agent --seconds 15
"""

import argparse
import json
import os
import pathlib
import re
import statistics
import subprocess
import tempfile
import threading
import time

import psutil

from embodied.core import tether
from embodied.perf import checkout

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
COMMON = ('--configs', 'debug', '--task', 'dummy_disc',
          '--run.eval_envs', '0', '--run.log_every', '5',
          '--run.save_every', '1e9', '--run.report_every', '1e9',
          '--logger.outputs', 'jsonl')


def make_parser():
    """The benchmark's command-line flags."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--envs', type=int, nargs='+', default=[1, 4, 8, 16])
    parser.add_argument(
        '--per_worker', type=int, nargs='+', default=[1, 4, 8])
    parser.add_argument('--seconds', type=float, default=30)
    parser.add_argument('--train_ratio', type=float, default=32)
    parser.add_argument(
        '--agent', type=str, nargs='+', default=['4x1', '4x4', '16x8'],
        help='test-agent settings as ENVSxPER_WORKER; each gives a parallel '
             'row and a single-process train row with as many envs')
    parser.add_argument('--train_burn', type=float, default=0.003)
    parser.add_argument('--skip_agent', action='store_true')
    parser.add_argument('--skip_random', action='store_true')
    parser.add_argument(
        '--dreamer', action='store_true',
        help='also DreamerV3 at debug in parallel, per --agent setting')
    parser.add_argument(
        '--dreamer_seconds', type=float, default=120,
        help='run.duration of the DreamerV3 rows, which compile first')
    parser.add_argument(
        '--old', type=str, default='',
        help='also measure the tree of this git revision, side by side')
    parser.add_argument(
        '--rounds', type=int, default=0,
        help='rounds of every row (default: 3 with --old, else 1)')
    parser.add_argument('--markdown', type=str, default='')
    return parser


def main(argv=None):
    parser = make_parser()
    args = parser.parse_args(argv)
    rounds = args.rounds or (3 if args.old else 1)
    for setting in args.agent:
        if not re.fullmatch(r'\d+x\d+', setting):
            parser.error(f"--agent {setting!r}: expected ENVSxPER_WORKER, "
                         f"e.g. 16x8")

    rows = plan(args)
    with tempfile.TemporaryDirectory() as tmp:
        trees = checkout.trees(args.old, tmp)
        results = {}  # (tree, row name) -> [measurement per round]
        for index in range(rounds):
            order = list(trees.items())
            if index % 2:
                order.reverse()
            for kind, name, flags, seconds in rows:
                for tree, root in order:
                    label = f'@{tree}' if tree else 'working tree'
                    results.setdefault((tree, name), [])
                    try:
                        measured = MEASURE[kind](name, seconds, root, *flags)
                    except RuntimeError as e:  # Reported, the others go on.
                        print(f'round {index + 1}/{rounds} {label}: {name} '
                              f'failed: {e}', flush=True)
                        continue
                    results[(tree, name)].append(measured)
                    print(f'round {index + 1}/{rounds} {label}: '
                          f'{format_row(measured)}{format_roles(measured)}',
                          flush=True)

    if args.old:
        table = compare(rows, results, args.old, rounds)
    else:
        table = markdown([results[('', name)][0] for _, name, *_ in rows
                          if results[('', name)]])
    print(table)
    if args.markdown:
        pathlib.Path(args.markdown).write_text(table + '\n')


def plan(args):
    """The rows as (kind, name, flags, seconds)."""
    rows = []
    for envs in ([] if args.skip_random else args.envs):
        for per_worker in args.per_worker:
            if per_worker > envs:
                continue
            name = f'random, {envs} envs, {per_worker}/worker'
            rows.append(('parallel', name, (
                '--random_agent', 'True', '--run.envs', envs,
                '--run.envs_per_worker', per_worker,
                '--run.actor_batch', max(1, envs // 2)), args.seconds))
    for setting in ([] if args.skip_agent else args.agent):
        envs, per_worker = (int(x) for x in setting.split('x'))
        flags = ('--agent_impl', 'testing', '--run.envs', envs,
                 '--run.train_ratio', args.train_ratio,
                 '--testing.train_burn', args.train_burn)
        name = f'test agent, ratio {args.train_ratio:g}, {envs} envs'
        rows.append(('parallel', f'{name}, {per_worker}/worker', (
            *flags, '--run.envs_per_worker', per_worker,
            '--run.actor_batch', max(1, envs // 2)), args.seconds))
        rows.append(('train', name, flags, args.seconds))
    for setting in (args.agent if args.dreamer else []):
        envs, per_worker = (int(x) for x in setting.split('x'))
        rows.append(('parallel', (
            f'dreamerv3 debug, ratio {args.train_ratio:g}, {envs} envs, '
            f'{per_worker}/worker'), (
            '--agent_impl', 'dreamerv3', '--run.envs', envs,
            '--run.train_ratio', args.train_ratio,
            '--run.envs_per_worker', per_worker,
            '--run.actor_batch', max(1, envs // 2)), args.dreamer_seconds))
    return rows


def measure_parallel(name, seconds, root, *flags):
    with tempfile.TemporaryDirectory() as tmp:
        output, used, pid, lines, samples = launch(
            root, 'embodied.run.parallel', seconds, '--script', 'parallel',
            '--logdir', os.path.join(tmp, 'run'), *flags)
    cpu = sum(used.values())
    summary = re.findall(r'\[Summary\] (.*)', output)
    if not summary:
        raise RuntimeError(f'{name}: no summary line:\n{output[-3000:]}')
    values = dict(item.split('=') for item in summary[-1].split())
    steps = float(values['env_steps'])
    return dict(
        runner='parallel', name=name,
        env_fps=float(values['env_fps']),
        train_fps=float(values['train_fps']),
        latency_ms=float(values['policy_batch_ms']),
        cpu_per_step=cpu / max(1.0, steps),
        first_step=float(values['first_step_s']),
        steady_fps=steady_fps(lines),
        steady_cpu_per_step=steady_cpu(lines, samples),
        roles={role: seconds / max(1.0, steps)
               for role, seconds in by_role(output, used, pid).items()})


def steady_window(lines):
    """((time, step), (time, step)) of the first `[Progress] step N/` line
    and the `at step N: saving and stopping.` line, timed by when each line
    arrived: the stepping alone, without start-up, final save and stop.
    None when the output has not both, a second apart."""
    start = stop = None
    for when, line in lines:
        if start is None:
            match = re.search(r'\[Progress\] step (\d+)/', line)
            if match:
                start = (when, int(match.group(1)))
        match = re.search(r' at step (\d+): saving and stopping', line)
        if match:
            stop = (when, int(match.group(1)))
            break
    if not (start and stop) or stop[0] - start[0] < 1.0:
        return None
    return start, stop


def steady_fps(lines):
    """Env steps/s over the `steady_window`; NaN without one."""
    window = steady_window(lines)
    if not window:
        return float('nan')
    (t0, step0), (t1, step1) = window
    return (step1 - step0) / (t1 - t0)


def steady_cpu(lines, samples):
    """CPU seconds of the process tree per env step over the
    `steady_window`, from `samples` ((time, CPU seconds so far), in time
    order) interpolated to its ends; NaN without a window or samples on
    both sides of it."""
    window = steady_window(lines)
    if not window:
        return float('nan')
    (t0, step0), (t1, step1) = window
    used = cpu_at(samples, t1) - cpu_at(samples, t0)
    return used / max(1, step1 - step0)


def cpu_at(samples, when):
    """The CPU seconds at `when`, linear between the samples around it;
    NaN outside them."""
    for (ta, ca), (tb, cb) in zip(samples, samples[1:]):
        if ta <= when <= tb:
            return ca if tb == ta else ca + (cb - ca) * (when - ta) / (tb - ta)
    return float('nan')


def measure_train(name, seconds, root, *flags):
    with tempfile.TemporaryDirectory() as tmp:
        logdir = os.path.join(tmp, 'run')
        output, used, _, _, _ = launch(
            root, 'embodied.main', seconds, '--script', 'train',
            '--logdir', logdir, '--run.log_every', '2', *flags)
        cpu = sum(used.values())
        rows = read_metrics(logdir)
    policy = [r['fps/policy'] for r in rows if r.get('fps/policy')]
    train = [r['fps/train'] for r in rows if r.get('fps/train')]
    steps = max([r.get('step', 0) for r in rows] or [0])
    batch_steps = 8 * 12  # batch_size * batch_length of --configs debug
    first = re.search(r'First env step ([\d.]+) s', output)
    return dict(
        runner='train', name=name,
        env_fps=mean(policy[1:] or policy),
        train_fps=mean(train[1:] or train) / batch_steps,
        latency_ms=float('nan'),
        cpu_per_step=cpu / max(1.0, steps),
        first_step=float(first.group(1)) if first else float('nan'))


MEASURE = {'parallel': measure_parallel, 'train': measure_train}


def launch(root, module, seconds, *flags, env=None, common=COMMON):
    """Runs a command of the tree at `root` for `seconds` of run.duration,
    with the flags `common` first (with the variables `env` added, those set
    to None removed; a PYTHONPATH there goes after `root`);
    returns its output, the CPU seconds of each process of its tree
    ({pid: seconds}), the pid of its first process, its output lines with
    the `time.monotonic()` each arrived at, and the tree's CPU seconds so
    far at each poll, (`time.monotonic()`, seconds)."""
    flags = [str(x) for x in (*common, '--run.steps', '1e9',
                              '--run.duration', seconds, *flags)]
    extra = dict(env or {})
    path = [str(root), extra.pop('PYTHONPATH', ''),
            os.environ.get('PYTHONPATH', '')]
    env = {**os.environ, 'PYTHONUNBUFFERED': '1', 'JAX_PLATFORMS': 'cpu',
           **extra, 'PYTHONPATH': os.pathsep.join(p for p in path if p)}
    env = {key: value for key, value in env.items() if value is not None}
    proc = tether.popen(
        ['-m', module, *flags], cwd=root, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(
        (time.monotonic(), line) for line in proc.stdout), daemon=True)
    try:
        reader.start()
        samples = []
        used = track_cpu(proc, timeout=seconds + 180, samples=samples)
    finally:
        tether.end(proc)  # Also what is left after an exception here.
    reader.join(10)
    output = ''.join(line for _, line in lines)
    if proc.returncode != 0:
        raise RuntimeError(
            f'{module} in {root} exited with {proc.returncode}:\n'
            f'{output[-3000:]}')
    return output, used, proc.pid, lines, samples


ROLES = ('launcher', 'agent', 'replay', 'logger', 'env workers', 'other')


def by_role(output, used, launcher):
    """CPU seconds per role of a parallel run, from the pids its launcher
    prints (`Workers: Agent (pid 12), ...`); the launcher is the root
    process, a process it does not name (e.g. a restarted env worker, a
    helper process) counts as `other`."""
    names = {}
    for line in re.findall(r'Workers: (.*)', output):
        for name, pid in re.findall(r'(\w[\w-]*) \(pid (\d+)\)', line):
            role = 'env workers' if name.startswith('Env') else name.lower()
            names[int(pid)] = role if role in ROLES else 'other'
    result = dict.fromkeys(ROLES, 0.0)
    for pid, seconds in used.items():
        role = 'launcher' if pid == launcher else names.get(pid, 'other')
        result[role] += seconds
    return result


def track_cpu(proc, timeout, samples=None):
    """Polls the process tree of `proc` (from `tether.popen`) until it
    exits, SIGKILLing its group after `timeout` s; returns the CPU seconds
    of each of its processes ({pid: seconds}). Appends (time, the tree's
    CPU seconds so far) of each poll to `samples`, if given."""
    root = psutil.Process(proc.pid)
    used = {}
    deadline = time.monotonic() + timeout
    while tether.running(proc):
        if time.monotonic() > deadline:
            tether.end(proc, grace=0)
            break
        try:
            for p in [root, *root.children(recursive=True)]:
                try:
                    times = p.cpu_times()
                    used[p.pid] = times.user + times.system
                except psutil.NoSuchProcess:
                    pass
        except psutil.NoSuchProcess:
            pass
        if samples is not None:
            samples.append((time.monotonic(), sum(used.values())))
        time.sleep(0.25)
    return used


def read_metrics(logdir):
    path = pathlib.Path(logdir) / 'metrics.jsonl'
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return rows


def mean(values):
    return sum(values) / len(values) if values else float('nan')


HEADER = ('| runner | setting | env steps/s | train steps/s | '
          'policy batch ms | CPU ms/env step | launch→first step s | '
          'steady env steps/s | steady CPU ms/env step |')


def format_row(row):
    return (f"| {row['runner']} | {row['name']} | {row['env_fps']:.0f} | "
            f"{row['train_fps']:.1f} | {row['latency_ms']:.2f} | "
            f"{1000 * row['cpu_per_step']:.2f} | {row['first_step']:.1f} | "
            f"{row.get('steady_fps', float('nan')):.0f} | "
            f"{1000 * row.get('steady_cpu_per_step', float('nan')):.3f} |")


def markdown(rows):
    lines = [HEADER, '|' + '---|' * 9]
    lines += [format_row(row) for row in rows]
    return '\n'.join(lines)


def compare(rows, results, old, rounds):
    """Per row: env steps/s and CPU ms per env step of every round at `old`
    and in the working tree, and the ratios of their medians."""
    def figures(key, scale=1, digits=0):
        return lambda ms: ', '.join(
            f"{scale * m.get(key, float('nan')):.{digits}f}" for m in ms)

    fps = figures('env_fps')
    steady = figures('steady_fps')
    cpu = figures('cpu_per_step', 1000, 2)
    steady_cpu = figures('steady_cpu_per_step', 1000, 3)
    median = lambda ms, key: statistics.median(
        m.get(key, float('nan')) for m in ms)
    ratio = lambda a, b, key: f'{median(b, key) / median(a, key):.2f}'
    lines = [
        f'{rounds} alternating rounds, working tree against {old}; ratios '
        f'are of the medians (working tree / {old})', '',
        f'| runner | setting | env steps/s {old} | env steps/s working tree '
        f'| env steps/s ratio | CPU ms/env step {old} | CPU ms/env step '
        f'working tree | CPU ratio | steady env steps/s {old} | steady env '
        f'steps/s working tree | steady ratio | steady CPU ms/env step {old} '
        f'| steady CPU ms/env step working tree | steady CPU ratio |',
        '|' + '---|' * 14]
    for kind, name, *_ in rows:
        a, b = results[(old, name)], results[('', name)]
        if not (a and b):
            cells = []
            for figure in (fps, cpu, steady, steady_cpu):
                cells += [figure(a) or 'failed', figure(b) or 'failed', '–']
            lines.append(f'| {kind} | {name} | ' + ' | '.join(cells) + ' |')
            continue
        lines.append(
            f"| {kind} | {name} | {fps(a)} | {fps(b)} | "
            f"{ratio(a, b, 'env_fps')} | {cpu(a)} | {cpu(b)} | "
            f"{ratio(a, b, 'cpu_per_step')} | {steady(a)} | {steady(b)} | "
            f"{ratio(a, b, 'steady_fps')} | {steady_cpu(a)} | "
            f"{steady_cpu(b)} | {ratio(a, b, 'steady_cpu_per_step')} |")
    parallel = [name for kind, name, *_ in rows if kind == 'parallel'
                and results[(old, name)] and results[('', name)]]
    measured = [m for name in parallel for tree in (old, '')
                for m in results[(tree, name)]]
    roles = [r for r in ROLES if any(m['roles'][r] for m in measured)]
    if parallel:
        lines += [
            '', f'CPU ms per env step by process, medians ({old} → working '
            f'tree); the launcher holds the agent\'s threads unless '
            f'run.agent_process:', '',
            '| setting | ' + ' | '.join(roles) + ' |',
            '|' + '---|' * (len(roles) + 1)]
        for name in parallel:
            a, b = results[(old, name)], results[('', name)]
            cells = [
                f"{statistics.median(m['roles'][r] for m in a) * 1000:.3f} → "
                f"{statistics.median(m['roles'][r] for m in b) * 1000:.3f}"
                for r in roles]
            lines.append(f'| {name} | ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


def format_roles(row):
    """' (CPU ms/env step: agent 0.12, ...)' for a parallel row."""
    if not row.get('roles'):
        return ''
    return ' (CPU ms/env step: ' + ', '.join(
        f'{role} {1000 * value:.3f}' for role, value in row['roles'].items()
        if value) + ')'


if __name__ == '__main__':
    main()
