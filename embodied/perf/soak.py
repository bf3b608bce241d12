"""Soak benchmark of the parallel runner: one long run, env workers killed.

    python -m embodied.perf.soak --minutes 20 --kill_every 120
    python -m embodied.perf.soak --minutes 1.5 --kill_every 30 \\
        --sample_every 15

Runs the real command line once (`--script parallel`, the numpy test agent,
`dummy_disc`, every server on loopback with `{auto}` ports; the flags of
`embodied.perf.faults` with `--run.envs 4`, `--run.log_every 10` and a
replay of `--replay_size` steps, so that its memory stops growing early) for
`--minutes`, ended by `run.duration` (a final save, exit 0). The run gets its
own process group, killed at the end and after `--minutes` + 3 minutes at
the latest. Meanwhile:

* every `--sample_every` seconds: the resident memory (RSS) of each role
  process, told apart by the pids the launcher prints (`Workers: Agent
  (thread), Logger (pid N), ...`, and `Restarted Env00001 (pid N)` after a
  restart; a role run as a thread counts in the launcher's row), and the env
  steps so far: the launcher's last `[Progress]` line and when it appeared
  (every `run.log_every` seconds), so rates are exact whatever the sampling;
* every `--kill_every` seconds: SIGKILL of one random live env worker
  (only one whose restart, after the run's back-off, comes 10 s before the
  end).

Prints per role the RSS at the first sample after `--warmup` seconds and at
the last sample, and the change; env steps/s per sample interval (with the
kills in it); the kills sent, the restarts the run printed (`Restarted ...`
lines) and the crashes it reported; and the run's exit code. Exits 1 unless
the run exited 0 and restarted every killed worker.
"""

import argparse
import os
import pathlib
import random
import re
import signal
import sys
import tempfile
import time

RESTARTED = re.compile(r'Restarted (\w+) \(pid (\d+)\)')
CRASHED = re.compile(r"Worker '(Env\w*)' ended unexpectedly")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--minutes', type=float, default=20)
    parser.add_argument('--kill_every', type=float, default=120,
                        help='seconds between env worker kills; 0: none')
    parser.add_argument('--sample_every', type=float, default=30)
    parser.add_argument('--warmup', type=float, default=None,
                        help='seconds before the first RSS baseline sample '
                             '(default: 60, at most a fifth of the run)')
    parser.add_argument('--envs', type=int, default=4)
    parser.add_argument('--replay_size', type=float, default=1e4)
    parser.add_argument('--save_every', type=float, default=60)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--keep', action='store_true',
                        help='keep the logdir and the run\'s output')
    parser.add_argument('flags', nargs='*',
                        help='more flags for the run (after --)')
    args = parser.parse_args(argv)
    try:
        import psutil
    except ImportError:
        sys.exit('embodied.perf.soak needs psutil to read the RSS of the '
                 'run\'s processes: pip install psutil')
    from embodied.perf import faults
    duration = args.minutes * 60
    warmup = args.warmup if args.warmup is not None else min(
        60, duration / 5)
    kills_planned = int(duration // args.kill_every) if args.kill_every else 0
    # A worker may be picked for every kill; none must exhaust its restarts.
    restarts = max(10, kills_planned + 1)
    flags = [
        '--run.envs', args.envs, '--run.steps', '1e9',
        '--run.duration', duration, '--run.log_every', 10,
        '--run.save_every', args.save_every, '--replay.size',
        args.replay_size, '--run.env_restarts', restarts, *args.flags]
    # A SIGTERM ends the benchmark through its `finally`, which kills the run.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    rng = random.Random(args.seed)
    folder = pathlib.Path(tempfile.mkdtemp(prefix='soak-'))
    run = None
    samples, kills = [], []
    print(f'Soak: {args.minutes:g} min, env kill every {args.kill_every:g} s, '
          f'sample every {args.sample_every:g} s, warm-up {warmup:g} s; '
          f'logs in {folder}', flush=True)
    try:
        run = faults.Run(folder / 'run', *flags, timeout=duration + 180,
                         name='soak')
        print(f'Command: {" ".join(map(str, run.proc.args[1:]))}', flush=True)
        start = time.monotonic()
        progress = Progress(run.logfile, start)
        next_sample = start
        next_kill = start + args.kill_every if args.kill_every else None
        code = None
        while run.proc.poll() is None:
            now = time.monotonic()
            progress.poll()
            if now > run.deadline:
                print('Run passed its time limit: killing its group.',
                      flush=True)
                run.kill()
                code = 'timeout'
                break
            if now >= next_sample:
                sample = take_sample(psutil, run, now - start, progress)
                if sample:
                    samples.append(sample)
                    print(format_sample(sample), flush=True)
                next_sample += args.sample_every
            if next_kill and now >= next_kill:
                kill = kill_env(psutil, run, rng, now - start, kills,
                                duration)
                if kill:
                    kills.append(kill)
                    print(f'[soak] t={kill["t"]:.0f} s: SIGKILL '
                          f'{kill["name"]} (pid {kill["pid"]})', flush=True)
                next_kill += args.kill_every
            time.sleep(0.2)
        code = code or run.wait()
    finally:
        if run:
            run.kill()
    output = run.output()
    report(samples, kills, output, code, warmup, faults.last_logged_step(
        folder / 'run'), time.monotonic() - start)
    if args.keep:
        print(f'Logdir and output: {folder}')
    else:
        import shutil
        shutil.rmtree(folder, ignore_errors=True)
    restarted = len(RESTARTED.findall(output))
    return 0 if code == 0 and restarted >= len(kills) else 1


def role_pids(run):
    """Role name -> pid, from the launcher's `Workers:` line and its
    `Restarted` lines; the launcher itself (and roles run as its threads)
    under `launcher`."""
    output = run.output()
    pids = {}
    line = re.search(r'^Workers: (.*)$', output, re.M)
    if line:
        for name, pid in re.findall(r'(\w+) \(pid (\d+)\)', line.group(1)):
            pids[name] = int(pid)
        threads = re.findall(r'(\w+) \(thread\)', line.group(1))
    else:
        threads = []
    for name, pid in RESTARTED.findall(output):
        pids[name] = int(pid)
    launcher = 'launcher' + ''.join(f' + {t}' for t in threads)
    return {launcher: run.proc.pid, **pids}


def live(psutil, run):
    """Pids of the run's processes now alive (zombies excluded)."""
    try:
        launcher = psutil.Process(run.proc.pid)
        procs = [launcher, *launcher.children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    alive = {}
    for proc in procs:
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                alive[proc.pid] = proc
        except psutil.NoSuchProcess:
            pass
    return alive


class Progress:
    """Reads the run's output as it grows: the step of each `[Progress]`
    line and the time (seconds since `start`) it was first seen."""

    def __init__(self, path, start):
        self.path, self.start = path, start
        self.offset, self.rest = 0, ''
        self.step, self.t = 0, 0.0

    def poll(self):
        try:
            with open(self.path, 'rb') as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        self.offset += len(data)
        lines = (self.rest + data.decode(errors='replace')).split('\n')
        self.rest = lines.pop()
        for line in lines:
            match = re.search(r'\[Progress\] step (\d+)/', line)
            if match:
                self.step = int(match.group(1))
                self.t = time.monotonic() - self.start


def take_sample(psutil, run, t, progress):
    pids = role_pids(run)
    if len(pids) < 2:
        return None  # The workers are not up yet.
    alive = live(psutil, run)
    rss = {}
    for name, pid in pids.items():
        if pid in alive:
            try:
                rss[name] = alive[pid].memory_info().rss
            except psutil.NoSuchProcess:
                pass
    total = 0
    for proc in alive.values():
        try:
            total += proc.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    # The step and when the launcher printed it: rates between samples are
    # then exact to the loop's 0.2 s, whatever run.log_every is.
    return dict(t=t, step=progress.step, step_t=progress.t, rss=rss,
                total=total)


def kill_env(psutil, run, rng, t, kills, duration):
    """SIGKILL of a random live env worker whose restart (after the
    env restart back-off, 0.5 s doubling with each crash of that worker up to
    30 s) comes at least 10 s before the run's end."""
    alive = live(psutil, run)
    envs = []
    for name, pid in role_pids(run).items():
        crashes = sum(k['name'] == name for k in kills)
        backoff = min(30, 0.5 * 2 ** crashes)
        if name.startswith('Env') and pid in alive and (
                t + backoff + 10 <= duration):
            envs.append((name, pid))
    if not envs:
        print(f'[soak] t={t:.0f} s: no env worker to kill (none alive, or '
              'none would restart before the end).', flush=True)
        return None
    name, pid = rng.choice(sorted(envs))
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return None
    return dict(t=t, name=name, pid=pid)


def format_sample(sample):
    mib = ', '.join(f'{name.split(" ")[0]} {rss / 2**20:.0f}'
                    for name, rss in sample['rss'].items())
    return (f'[soak] t={sample["t"]:.0f} s: step {sample["step"]}; RSS MiB: '
            f'{mib}; all {sample["total"] / 2**20:.0f}')


def roles(sample):
    """Rows of the RSS table for one sample: each non-env role, the env
    workers' mean and sum, and every process of the run."""
    rows = {k: v for k, v in sample['rss'].items() if not k.startswith('Env')}
    envs = [v for k, v in sample['rss'].items() if k.startswith('Env')]
    if envs:
        rows[f'env worker (mean of {len(envs)})'] = sum(envs) / len(envs)
        rows['env workers (sum)'] = sum(envs)
    rows['all processes of the run'] = sample['total']
    return rows


def report(samples, kills, output, code, warmup, metrics_step, wall):
    print()
    base = next((s for s in samples if s['t'] >= warmup),
                samples[-1] if samples else None)
    last = samples[-1] if samples else None
    if base is None:
        print('No samples taken.')
    else:
        print(f'RSS per role (start: first sample after warm-up, '
              f't={base["t"]:.0f} s; end: last sample, t={last["t"]:.0f} s)')
        print('| role | start MiB | end MiB | change |')
        print('|---|---|---|---|')
        start, end = roles(base), roles(last)
        for name in start:
            if name not in end:
                continue
            a, b = start[name], end[name]
            change = f'{100 * (b - a) / a:+.1f}%' if a else '?'
            print(f'| {name} | {a / 2**20:.1f} | {b / 2**20:.1f} | {change} |')
    print()
    # Windows run between the `[Progress]` lines last seen at each sample.
    points = [s for s in samples if s['step_t'] > 0]
    points = [s for i, s in enumerate(points)
              if i == 0 or s['step_t'] > points[i - 1]['step_t']]
    print('Env steps/s per interval (between the [Progress] lines last '
          'printed before each sample)')
    print('| window s | steps | steps/s | env kills in it |')
    print('|---|---|---|---|')
    for prev, cur in zip(points, points[1:]):
        a, b = prev['step_t'], cur['step_t']
        steps = cur['step'] - prev['step']
        killed = sum(a <= k['t'] < b for k in kills)
        print(f'| {a:.0f}-{b:.0f} | {steps} | {steps / (b - a):.0f} | '
              f'{killed} |')
    if len(points) > 1:
        a, b = points[0], points[-1]
        print(f'| {a["step_t"]:.0f}-{b["step_t"]:.0f} (all) | '
              f'{b["step"] - a["step"]} | '
              f'{(b["step"] - a["step"]) / (b["step_t"] - a["step_t"]):.0f} '
              f'| {sum(a["step_t"] <= k["t"] < b["step_t"] for k in kills)} |')
    summary = re.search(r'\[Summary\] (.*)', output)
    restarted = RESTARTED.findall(output)
    crashed = CRASHED.findall(output)
    others = sorted(set(re.findall(
        r"Worker '(\w+)' ended unexpectedly", output)) - set(crashed))
    print()
    others = f'; other roles ended unexpectedly: {", ".join(others)}' if (
        others) else ''
    print(f'Env kills sent: {len(kills)}; crashes reported: {len(crashed)}; '
          f'restarts seen: {len(restarted)}{others}.')
    print(f'Final step (metrics): {metrics_step}; wall {wall:.0f} s.')
    if summary:
        print(f'Run summary: {summary.group(1)}')
    print(f'Run exit code: {code}')


if __name__ == '__main__':
    sys.exit(main())
