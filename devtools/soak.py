"""Soak benchmark of the parallel runner: a night unattended, with the
faults a night brings.

    python -m devtools.soak --hours 2                   # the night
    python -m devtools.soak --minutes 1 --agent testing --save_every 5 \\
        --kill_every 12 --term_every 25 --tree_kill_at 40 --window 15

Runs `--script parallel` (DreamerV3 `debug` by default on the default
task, `cartpole_balance`; every server on loopback with `{auto}` ports, the
flags of `devtools.faults` with `--run.envs 4`, `--run.log_every 10`
and a replay of `--replay_size` steps) in one logdir for the whole duration, saving every `--save_every`
seconds. Meanwhile:

* every `--kill_every` seconds: SIGKILL of one random live env worker;
* every `--term_every` seconds: SIGTERM to the run's process group, as a
  scheduler sends it, and the same command again (it resumes);
* once, at `--tree_kill_at` seconds: SIGKILL of every process of the run,
  and the same command again;
* every `--sample_every` seconds: per process of the run its resident
  memory (RSS), open file descriptors and threads, the logdir's size and
  the env steps printed so far (`[Progress]`).

No SIGTERM, relaunch or env kill comes in the last sixth of the soak (at
most its last 2 minutes): the run could not answer it before its end.

Each launch runs until the soak's end (`run.duration`, a final save, exit
0) unless a fault ends it first. Prints, per `--window` seconds, the RSS per
role, descriptors, threads, the logdir's size, env steps/s and restarts,
then the checks, and exits 1 unless all pass:

* **flat**: after the first `--settle` seconds (20 minutes; the checks are
  skipped when the run is shorter), no window's RSS of a role or of all the
  run's processes, nor its open descriptors, exceeds the first settled
  window's by more than 10%; samples within `--warmup` seconds of a launch
  (compiling, loading the replay) are left out;
* **resumes**: every relaunch resumed at the newest save complete in every
  role just before it;
* **restarts**: every killed env worker was restarted (unless its launch
  ended first), and the last launch exited 0;
* **metrics**: in `metrics.jsonl` no step goes backwards, no two periodic
  rows (those of the logger's `fps/env`) have one step, and no gap between
  two periodic rows is longer than 10 times their median gap (steps lost
  to a wrong rewind on resume span a save interval, 30 of them);
* **logdir**: at most `run.save_keep` complete saves per role; nothing
  else in the checkpoint folders but the saves a resume set aside (a
  `damaged-` one, or an `unused-` one still newer than the oldest kept
  save); all together no larger than the newest save times their count
  per role (10% slack). The replay's folders keep every chunk written, as
  the original's do (a save names the chunks it holds); their size is
  reported beside the env steps.
"""

import argparse
import json
import os
import pathlib
import random
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time

RESTARTED = re.compile(r'Restarted (\w+) \(pid (\d+)\)')
SAVE_KEEP = 3  # configs/defaults.yaml run.save_keep, which the soak keeps.


def make_parser():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--hours', type=float, default=None)
    parser.add_argument('--minutes', type=float, default=20)
    parser.add_argument('--agent', default='dreamerv3',
                        help='run.agent_impl (dreamerv3 or testing)')
    parser.add_argument('--task', default='cartpole_balance')
    parser.add_argument('--envs', type=int, default=4)
    parser.add_argument('--replay_size', type=float, default=1e4)
    parser.add_argument('--save_every', type=float, default=300)
    parser.add_argument('--kill_every', type=float, default=600,
                        help='seconds between env worker kills; 0: none')
    parser.add_argument('--term_every', type=float, default=1800,
                        help='seconds between SIGTERM plus relaunch; 0: none')
    parser.add_argument(
        '--tree_kill_at', type=float, default=None,
        help='seconds into the soak of the one SIGKILL of the whole tree '
             '(default: 62.5%% of the duration, between two SIGTERMs); '
             '0: none')
    parser.add_argument('--sample_every', type=float, default=30)
    parser.add_argument('--window', type=float, default=600)
    parser.add_argument('--settle', type=float, default=1200)
    parser.add_argument('--warmup', type=float, default=120)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--keep', action='store_true',
                        help='keep the logdir and the run\'s output')
    parser.add_argument('flags', nargs='*',
                        help='more flags for the run (after --)')
    return parser


def main(argv=None):
    args = make_parser().parse_args(argv)
    try:
        import psutil
    except ImportError:
        sys.exit('devtools.soak needs psutil to read the run\'s '
                 'processes: pip install psutil')
    duration = 3600 * args.hours if args.hours else 60 * args.minutes
    tree_kill_at = (0.625 * duration if args.tree_kill_at is None
                    else args.tree_kill_at)
    # A SIGTERM ends the benchmark through its `finally`, which kills the run.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    folder = pathlib.Path(tempfile.mkdtemp(prefix='soak-'))
    print(f'Soak: {duration / 60:g} min of --script parallel with '
          f'{args.agent}, saves every {args.save_every:g} s, env kill every '
          f'{args.kill_every:g} s, SIGTERM and relaunch every '
          f'{args.term_every:g} s, tree SIGKILL at {tree_kill_at:g} s; logs '
          f'in {folder}', flush=True)
    soak = Soak(psutil, args, folder, duration, tree_kill_at)
    try:
        soak.run()
    finally:
        soak.stop()
    passed = report(soak, args)
    if args.keep:
        print(f'Logdir and output: {folder}')
    else:
        shutil.rmtree(folder, ignore_errors=True)
    return 0 if passed else 1


class Soak:
    """The launches of one soak, their samples and the faults sent."""

    def __init__(self, psutil, args, folder, duration, tree_kill_at):
        self.psutil, self.args, self.folder = psutil, args, folder
        self.logdir = folder / 'run'
        self.duration, self.tree_kill_at = duration, tree_kill_at
        self.rng = random.Random(args.seed)
        self.launches, self.samples, self.kills = [], [], []
        self.proc = None

    def flags(self, remaining):
        args = self.args
        kills = int(self.duration // args.kill_every) if args.kill_every else 0
        return (
            '--agent_impl', args.agent, '--task', args.task,
            '--run.envs', args.envs,
            '--run.steps', '1e9', '--run.duration', round(remaining),
            '--run.log_every', 10, '--run.save_every', args.save_every,
            '--run.save_keep', SAVE_KEEP, '--replay.size', args.replay_size,
            '--run.env_restarts', max(10, kills + 1), *args.flags)

    def run(self):
        from devtools import faults
        args = self.args
        self.start = time.monotonic()
        end = self.start + self.duration
        self.next_kill = args.kill_every or None
        self.next_term = args.term_every or None
        self.tree_kill = self.tree_kill_at or None
        # No relaunch, no SIGTERM and no env kill this close to the end:
        # the launch would end before it is up, or before it restarts the
        # killed worker.
        self.margin = min(120, self.duration / 6)
        while time.monotonic() < end - self.margin:
            t0 = time.monotonic() - self.start
            expected = newest_complete(self.logdir)
            index = len(self.launches)
            run = faults.Run(
                self.logdir, *self.flags(end - time.monotonic()),
                timeout=end - time.monotonic() + 300, name=f'launch{index}',
                logs=self.folder)
            self.proc = run
            launch = dict(index=index, t0=t0, expected=expected, run=run,
                          ended_by='run.duration')
            self.launches.append(launch)
            print(f'[soak] t={t0:.0f} s: launch {index} (newest complete '
                  f'save: {expected})', flush=True)
            self.watch(run, launch)
            launch['code'] = run.wait()
            launch['t1'] = time.monotonic() - self.start
            output = run.output()
            launch['resumed'] = faults.resumed_step(output)
            launch['restarted'] = len(RESTARTED.findall(output))
            print(f'[soak] t={launch["t1"]:.0f} s: launch {index} ended by '
                  f'{launch["ended_by"]}, exit {launch["code"]}, resumed at '
                  f'{launch["resumed"]}, {launch["restarted"]} env restarts',
                  flush=True)
            if launch['ended_by'] == 'run.duration':
                break
        self.proc = None

    def watch(self, run, launch):
        """Samples the launch and sends it the faults that fall due, until
        it ends or a fault (or its time limit) ends it."""
        args = self.args
        progress = Progress(run.logfile, self.start)
        next_sample = time.monotonic()
        while run.proc.poll() is None:
            now = time.monotonic()
            t = now - self.start
            progress.poll()
            if now > run.deadline:
                print('[soak] a launch passed its time limit: killing '
                      'its group.', flush=True)
                launch['ended_by'] = 'the time limit'
                run.kill()
                return
            if now >= next_sample:
                sample = self.sample(run, launch, t, progress)
                if sample:
                    self.samples.append(sample)
                    print(format_sample(sample), flush=True)
                next_sample += args.sample_every
            if self.next_term and t >= self.next_term:
                self.next_term += args.term_every
                if t < self.duration - self.margin:
                    launch['ended_by'] = 'SIGTERM'
                    print(f'[soak] t={t:.0f} s: SIGTERM to the run\'s '
                          'group', flush=True)
                    os.killpg(run.proc.pid, signal.SIGTERM)
                    return
            if self.tree_kill and t >= self.tree_kill:
                self.tree_kill = None
                launch['ended_by'] = 'SIGKILL of the tree'
                print(f'[soak] t={t:.0f} s: SIGKILL of every process of '
                      'the run', flush=True)
                self.kill_tree(run)
                return
            if self.next_kill and t >= self.next_kill and (
                    t < self.duration - self.margin):
                # A kill due while no worker is up (a launch starting)
                # comes once one is, not never.
                if self.kill_env(run, t):
                    self.next_kill += args.kill_every
                else:
                    self.next_kill = t + 5
            time.sleep(0.2)

    def stop(self):
        if self.proc:
            self.proc.kill()

    def processes(self, run):
        """Live processes of the run (zombies excluded), by pid."""
        psutil = self.psutil
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

    def sample(self, run, launch, t, progress):
        pids = role_pids(run)
        if len(pids) < 2:
            return None  # The workers are not up yet.
        alive = self.processes(run)
        roles = {pid: name for name, pid in pids.items()}
        rss, fds, threads = {}, 0, 0
        for pid, proc in alive.items():
            try:
                with proc.oneshot():
                    memory = proc.memory_info().rss
                    fds += proc.num_fds()
                    threads += proc.num_threads()
            except self.psutil.Error:
                continue
            name = roles.get(pid, 'other')
            rss[name] = rss.get(name, 0) + memory
        return dict(
            t=t, launch=launch['index'], since_launch=t - launch['t0'],
            step=progress.step, step_t=progress.t, rss=rss,
            total=sum(rss.values()), fds=fds, threads=threads,
            logdir=folder_bytes(self.logdir))

    def kill_env(self, run, t):
        """SIGKILL of a random live env worker; False if none is alive."""
        alive = self.processes(run)
        envs = sorted((name, pid) for name, pid in role_pids(run).items()
                      if name.startswith('Env') and pid in alive)
        if not envs:
            return False
        name, pid = self.rng.choice(envs)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        self.kills.append(dict(t=t, name=name, launch=len(self.launches) - 1))
        print(f'[soak] t={t:.0f} s: SIGKILL {name} (pid {pid})', flush=True)
        return True

    def kill_tree(self, run):
        tree = list(self.processes(run).values())
        for proc in tree:
            try:
                proc.kill()
            except self.psutil.NoSuchProcess:
                pass
        run.kill()


def role_pids(run):
    """Role name -> pid, from the launcher's `Workers:` line and its
    `Restarted` lines; the launcher itself (and roles run as its threads)
    under `launcher`."""
    output = run.output()
    pids = {'launcher': run.proc.pid}
    line = re.search(r'^Workers: (.*)$', output, re.M)
    if line:
        for name, pid in re.findall(r'(\w+) \(pid (\d+)\)', line.group(1)):
            pids[name] = int(pid)
    for name, pid in RESTARTED.findall(output):
        pids[name] = int(pid)
    return pids


class Progress:
    """Reads a launch's output as it grows: the step of its last
    `[Progress]` line and when (seconds since `start`) it was first seen."""

    def __init__(self, path, start):
        self.path, self.start = path, start
        self.offset, self.rest = 0, ''
        self.step, self.t = None, 0.0  # None: no progress line yet.

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


def newest_complete(logdir):
    """The newest save tag complete in every role, or None."""
    from devtools import faults
    tags = [set(faults.tags(logdir, role))
            for role in ('agent', 'replay', 'logger')]
    common = set.intersection(*tags)
    return max(common) if common else None


def folder_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


def format_sample(sample):
    mib = ', '.join(f'{name} {rss / 2**20:.0f}'
                    for name, rss in sample['rss'].items()
                    if not name.startswith('Env'))
    return (f'[soak] t={sample["t"]:.0f} s: launch {sample["launch"]}, step '
            f'{sample["step"]}; RSS MiB: {mib}, all '
            f'{sample["total"] / 2**20:.0f}; fds {sample["fds"]}, threads '
            f'{sample["threads"]}; logdir {sample["logdir"] / 2**20:.1f} MiB')


def role_rss(sample):
    """RSS columns of one sample: launcher (with its thread roles), replay,
    logger, the env workers' mean, all processes."""
    rss = sample['rss']
    envs = [v for k, v in rss.items() if k.startswith('Env')]
    return {
        'launcher': rss.get('launcher'), 'Replay': rss.get('Replay'),
        'Logger': rss.get('Logger'),
        'env worker': sum(envs) / len(envs) if envs else None,
        'all': sample['total']}


def windows(soak, args):
    """One row per `--window` seconds: steady means (samples at least
    `--warmup` after their launch) of RSS, fds and threads, the logdir at
    the window's last sample, env steps/s and restarts."""
    rows = []
    count = int(-(-soak.duration // args.window))
    for index in range(count):
        a, b = index * args.window, (index + 1) * args.window
        inside = [s for s in soak.samples if a <= s['t'] < b]
        steady = [s for s in inside if s['since_launch'] >= args.warmup]
        row = dict(a=a, b=min(b, soak.duration), steady=len(steady))
        for key in ('launcher', 'Replay', 'Logger', 'env worker', 'all'):
            values = [role_rss(s)[key] for s in steady]
            values = [v for v in values if v is not None]
            row[key] = statistics.mean(values) if values else None
        for key in ('fds', 'threads'):
            row[key] = statistics.mean(s[key] for s in steady) if (
                steady) else None
        row['logdir'] = inside[-1]['logdir'] if inside else None
        steps = 0
        for prev, cur in zip(soak.samples, soak.samples[1:]):
            if prev['launch'] == cur['launch'] and a <= cur['t'] < b and (
                    prev['step'] is not None):
                steps += cur['step'] - prev['step']
        row['fps'] = steps / (row['b'] - a)
        row['env_kills'] = sum(a <= k['t'] < b for k in soak.kills)
        row['relaunches'] = sum(
            a <= launch['t0'] < b for launch in soak.launches[1:])
        rows.append(row)
    return rows


def check_flat(rows, args, duration):
    if duration <= args.settle + args.window:
        return None, (f'not checked: the soak is not longer than --settle '
                      f'({args.settle:g} s) plus a window')
    settled = [r for r in rows if r['a'] >= args.settle and r['steady']]
    if len(settled) < 2:
        return False, 'fewer than two settled windows with steady samples'
    base = settled[0]
    worst = []
    for key in ('launcher', 'Replay', 'Logger', 'env worker', 'all', 'fds'):
        if base[key] is None:
            continue
        growth = max((r[key] / base[key] - 1) for r in settled
                     if r[key] is not None)
        worst.append(f'{key} {100 * growth:+.1f}%')
        if growth > 0.10:
            return False, f'{key} grew {100 * growth:.1f}% ({", ".join(worst)})'
    return True, ('largest growth over the first settled window: '
                  + ', '.join(worst))


def check_resumes(soak):
    bad, said = [], []
    for launch in soak.launches[1:]:
        said.append(f'{launch["resumed"]}')
        if launch['resumed'] != launch['expected']:
            bad.append(f'launch {launch["index"]} resumed at '
                       f'{launch["resumed"]}, the newest complete save was '
                       f'{launch["expected"]}')
    if not soak.launches[1:]:
        return None, 'not checked: no relaunch'
    if bad:
        return False, '; '.join(bad)
    return True, (f'{len(said)} relaunches, each at the newest complete save '
                  f'(steps {", ".join(said)})')


def check_restarts(soak):
    last = soak.launches[-1] if soak.launches else None
    if not last or last['ended_by'] != 'run.duration' or last['code'] != 0:
        return False, ('the last launch did not end by run.duration with '
                       f'exit 0: {last and (last["ended_by"], last["code"])}')
    missing = []
    for launch in soak.launches:
        kills = [k for k in soak.kills if k['launch'] == launch['index']]
        # A kill within a minute of a fault that ended the launch may not
        # have been restarted yet, and needs not be.
        due = [k for k in kills if launch['ended_by'] == 'run.duration' or (
            k['t'] < launch['t1'] - 60)]
        if launch['restarted'] < len(due):
            missing.append(f'launch {launch["index"]}: {len(due)} kills, '
                           f'{launch["restarted"]} restarts')
    if missing:
        return False, '; '.join(missing)
    return True, (f'{len(soak.kills)} env kills, '
                  f'{sum(l["restarted"] for l in soak.launches)} restarts; '
                  'the last launch exited 0')


def check_metrics(logdir):
    path = pathlib.Path(logdir) / 'metrics.jsonl'
    if not path.exists():
        return False, f'{path} is missing'
    rows = [json.loads(line) for line in path.read_text().splitlines()
            if line.strip()]
    periodic = []
    for index, row in enumerate(rows):
        if index and row['step'] < rows[index - 1]['step']:
            return False, (f'row {index + 1} goes back from step '
                           f'{rows[index - 1]["step"]} to {row["step"]}')
        if 'fps/env' in row:
            if periodic and periodic[-1] == row['step']:
                return False, (f'two periodic rows at step {row["step"]} '
                               f'(row {index + 1})')
            periodic.append(row['step'])
    gaps = [b - a for a, b in zip(periodic, periodic[1:])]
    if not gaps:
        return False, 'fewer than two periodic rows'
    median = statistics.median(gaps)
    if max(gaps) > 10 * max(median, 1):
        at = periodic[gaps.index(max(gaps))]
        return False, (f'a gap of {max(gaps)} steps after step {at} '
                       f'(median gap {median:g})')
    return True, (f'{len(rows)} rows, steps never go back; {len(periodic)} '
                  f'periodic rows, one per step, largest gap {max(gaps)} '
                  f'steps (median {median:g})')


def check_logdir(logdir, args):
    from devtools import faults
    logdir = pathlib.Path(logdir)
    counts, aside, left = {}, {}, []
    for role in ('agent', 'replay', 'logger'):
        folder = logdir / 'ckpt' / role
        complete = faults.tags(logdir, role)
        counts[role] = len(complete)
        aside[role] = 0
        for path in folder.iterdir() if folder.exists() else []:
            kind, _, rest = path.name.partition('-')
            if path.name.isdigit() and int(path.name) in complete:
                continue
            # A save set aside on resume may stay while it is newer than
            # the oldest kept save; anything else is left behind for good.
            if kind in ('unused', 'damaged') and complete and (
                    kind == 'damaged' or int(rest[:12]) > complete[0]):
                aside[role] += 1
            else:
                left.append(f'{role}/{path.name}')
    steps = {name: sum(int(p.stem.rsplit('-', 1)[-1])
                       for p in (logdir / name).glob('*.npz'))
             for name in ('replay', 'replay_eval')}
    ckpt = folder_bytes(logdir / 'ckpt')
    replay = sum(folder_bytes(logdir / name)
                 for name in ('replay', 'replay_eval'))
    newest = newest_complete(logdir)
    save = sum(folder_bytes(logdir / 'ckpt' / role / f'{newest:012d}')
               for role in ('agent', 'replay', 'logger')) if newest else 0
    total = folder_bytes(logdir)
    folders = SAVE_KEEP + max(aside.values())
    detail = (
        f'complete saves per role {counts} (run.save_keep {SAVE_KEEP}), set '
        f'aside on resume and still among the newest {aside}, left behind '
        f'{left or "none"}; ckpt {ckpt / 2**20:.1f} MiB = '
        f'{ckpt / max(save, 1):.2f} x the newest save; replay folders '
        f'{replay / 2**20:.1f} MiB ({steps["replay"]} + '
        f'{steps["replay_eval"]} steps); the rest '
        f'{(total - ckpt - replay) / 2**20:.1f} MiB; logdir '
        f'{total / 2**20:.1f} MiB')
    ok = (all(count <= SAVE_KEEP for count in counts.values()) and not left
          and ckpt <= 1.1 * folders * save)
    return ok, detail


def report(soak, args):
    print()
    rows = windows(soak, args)
    mib = lambda x: '–' if x is None else f'{x / 2**20:.0f}'
    num = lambda x: '–' if x is None else f'{x:.0f}'
    print(f'Per {args.window:g} s window (RSS, descriptors and threads: mean '
          f'of the samples at least {args.warmup:g} s after their launch; '
          'logdir: at the last sample):')
    print('| minutes | launcher MiB | replay MiB | logger MiB | env worker '
          'MiB | all MiB | open fds | threads | logdir MiB | env steps/s | '
          'env kills | relaunches |')
    print('|---|---|---|---|---|---|---|---|---|---|---|---|')
    for row in rows:
        logdir = '–' if row['logdir'] is None else (
            f'{row["logdir"] / 2**20:.1f}')
        print(f'| {row["a"] / 60:g}-{row["b"] / 60:g} | {mib(row["launcher"])} '
              f'| {mib(row["Replay"])} | {mib(row["Logger"])} | '
              f'{mib(row["env worker"])} | {mib(row["all"])} | '
              f'{num(row["fds"])} | {num(row["threads"])} | {logdir} | '
              f'{row["fps"]:.0f} | {row["env_kills"]} | {row["relaunches"]} |')
    print()
    print('| launch | started min | ended by | exit | resumed at | newest '
          'complete save before | env restarts |')
    print('|---|---|---|---|---|---|---|')
    for launch in soak.launches:
        print(f'| {launch["index"]} | {launch["t0"] / 60:.1f} | '
              f'{launch["ended_by"]} | {launch["code"]} | '
              f'{launch["resumed"]} | {launch["expected"]} | '
              f'{launch["restarted"]} |')
    print()
    checks = {
        'flat': check_flat(rows, args, soak.duration),
        'resumes': check_resumes(soak),
        'restarts': check_restarts(soak),
        'metrics': check_metrics(soak.logdir),
        'logdir': check_logdir(soak.logdir, args)}
    for name, (ok, detail) in checks.items():
        verdict = {True: 'pass', False: 'FAIL', None: 'skipped'}[ok]
        print(f'{name}: {verdict}: {detail}')
    passed = all(ok is not False for ok, _ in checks.values())
    print(f'Soak {"passed" if passed else "FAILED"}.')
    return passed


if __name__ == '__main__':
    sys.exit(main())
