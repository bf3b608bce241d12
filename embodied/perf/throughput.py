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

Columns: env steps/s and train steps/s after the first env step, mean policy
batch latency (first request of a batch waiting to the reply), CPU seconds of
the whole process tree per env step, and seconds from launch to the first env
step. Each run is a command in its own logdir, stopped by `run.duration`.
"""

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

import psutil

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
COMMON = ('--configs', 'debug', '--task', 'dummy_disc',
          '--run.eval_envs', '0', '--run.log_every', '5',
          '--run.save_every', '1e9', '--run.report_every', '1e9',
          '--logger.outputs', 'jsonl')


def main(argv=None):
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
    parser.add_argument('--markdown', type=str, default='')
    args = parser.parse_args(argv)

    rows = []
    for envs in args.envs:
        for per_worker in args.per_worker:
            if per_worker > envs:
                continue
            rows.append(measure_parallel(
                f'random, {envs} envs, {per_worker}/worker', args.seconds,
                '--random_agent', 'True', '--run.envs', envs,
                '--run.envs_per_worker', per_worker,
                '--run.actor_batch', max(1, envs // 2)))
            print(format_row(rows[-1]), flush=True)
    for setting in ([] if args.skip_agent else args.agent):
        envs, per_worker = (int(x) for x in setting.split('x'))
        flags = ('--agent_impl', 'testing', '--run.envs', envs,
                 '--run.train_ratio', args.train_ratio,
                 '--testing.train_burn', args.train_burn)
        name = f'test agent, ratio {args.train_ratio:g}, {envs} envs'
        rows.append(measure_parallel(
            f'{name}, {per_worker}/worker', args.seconds, *flags,
            '--run.envs_per_worker', per_worker,
            '--run.actor_batch', max(1, envs // 2)))
        print(format_row(rows[-1]), flush=True)
        rows.append(measure_train(name, args.seconds, *flags))
        print(format_row(rows[-1]), flush=True)

    table = markdown(rows)
    print(table)
    if args.markdown:
        pathlib.Path(args.markdown).write_text(table + '\n')


def measure_parallel(name, seconds, *flags):
    with tempfile.TemporaryDirectory() as tmp:
        output, cpu, wall = launch(
            'embodied.run.parallel', seconds, '--script', 'parallel',
            '--logdir', os.path.join(tmp, 'run'), *flags)
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
        first_step=float(values['first_step_s']))


def measure_train(name, seconds, *flags):
    with tempfile.TemporaryDirectory() as tmp:
        logdir = os.path.join(tmp, 'run')
        output, cpu, wall = launch(
            'embodied.main', seconds, '--script', 'train',
            '--logdir', logdir, '--run.log_every', '2', *flags)
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


def launch(module, seconds, *flags):
    """Runs a command for `seconds` of run.duration; returns its output and
    the CPU seconds its whole process tree used."""
    flags = [str(x) for x in (*COMMON, '--run.steps', '1e9',
                              '--run.duration', seconds, *flags)]
    env = {**os.environ, 'PYTHONUNBUFFERED': '1', 'JAX_PLATFORMS': 'cpu',
           'PYTHONPATH': str(ROOT) + os.pathsep + os.environ.get(
               'PYTHONPATH', '')}
    start = time.monotonic()
    with tempfile.TemporaryFile('w+') as log:
        proc = subprocess.Popen(
            [sys.executable, '-m', module, *flags], cwd=ROOT, env=env,
            stdout=log, stderr=subprocess.STDOUT)
        cpu = track_cpu(proc, timeout=seconds + 180)
        log.seek(0)
        output = log.read()
    if proc.returncode != 0:
        raise RuntimeError(
            f'{module} exited with {proc.returncode}:\n{output[-3000:]}')
    return output, cpu, time.monotonic() - start


def track_cpu(proc, timeout):
    """Polls the process tree until it exits; returns its CPU seconds."""
    root = psutil.Process(proc.pid)
    used = {}
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        if time.monotonic() > deadline:
            proc.kill()
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
        time.sleep(0.25)
    proc.wait()
    return sum(used.values())


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
          'policy batch ms | CPU ms/env step | launch→first step s |')


def format_row(row):
    return (f"| {row['runner']} | {row['name']} | {row['env_fps']:.0f} | "
            f"{row['train_fps']:.1f} | {row['latency_ms']:.2f} | "
            f"{1000 * row['cpu_per_step']:.2f} | {row['first_step']:.1f} |")


def markdown(rows):
    lines = [HEADER, '|' + '---|' * 7]
    lines += [format_row(row) for row in rows]
    return '\n'.join(lines)


if __name__ == '__main__':
    main()
