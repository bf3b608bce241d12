"""Learning benchmark: DreamerV3 on a task with the parallel runner.

    python -m embodied.perf.learning --duration 3600 --logdir /tmp/cartpole
    python -m embodied.perf.learning --script train -- --agent.opt.lr 1e-4
    python -m embodied.perf.learning --configs 'dmc_vision dmc_cartpole' \
        --target 800 --ymax 1000

Launches `embodied.main --configs cartpole` (or the given `--configs`; extra
flags after `--` are passed on), follows the run's `scores.jsonl` and
`metrics.jsonl` as they grow, and prints the score (mean of the last 20
episodes) against env steps and wall time (compilation included), with train
and env steps per second; `--target` is the score whose first crossing is
reported (400 for CartPole; DMC scores go to 1000). At the end it writes
`learning.json` and the curves (`embodied.plot`: `learning.png` and
`learning.svg`, score against env steps and wall time) into the logdir.
`--analyze` redoes the summary and the curves from a finished benchmark's
`learning.json` and the `scores.jsonl` beside it.

`--reference` names the original's published scores of a suite: a suite
whose DreamerV3 runs ship with `embodied.plot` (e.g. `dmc_vision`), or a
file in its scores format (`scores/<suite>-<method>.json.gz` in a checkout
of danijar/dreamerv3); the summary then prints beside ours the
original's score at the same env steps (the mean over its seeds of the
episodes that ended since the previous row). The task is the run's
(`--reference_task` overrides it).
"""

import argparse
import gzip
import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np

from embodied.core import tether

WINDOW = 20
TARGET = 400


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--script', default='parallel')
    parser.add_argument('--duration', type=float, default=3600)
    parser.add_argument('--logdir', default='')
    parser.add_argument('--configs', default='cartpole')
    parser.add_argument('--target', type=float, default=TARGET,
                        help='score whose first crossing is reported')
    parser.add_argument('--ymax', type=float, default=500,
                        help='top of the plots\' score axis')
    parser.add_argument('--every', type=float, default=60,
                        help='seconds between progress lines')
    parser.add_argument('--analyze', default='',
                        help='summarise an existing learning.json')
    parser.add_argument('--reference', default='',
                        help="the original's published scores: a suite "
                             '(dmc_vision, ...) or a scores file')
    parser.add_argument('--reference_task', default='',
                        help='the task in --reference (default: the run\'s)')
    args, extra = parser.parse_known_args(argv)
    extra = [x for x in extra if x != '--']
    if args.analyze:
        path = pathlib.Path(args.analyze)
        record = json.loads(path.read_text())
        record.setdefault('target', args.target)
        record.setdefault('ymax', args.ymax)
        if args.reference:
            record['reference'] = reference_settings(args, path.parent)
        plot(record, path.parent)
        summarize(record)
        return
    logdir = pathlib.Path(args.logdir or f'/tmp/embodied-learning-{int(time.time())}')
    if args.reference:
        load_reference(args.reference)  # A bad file fails before the run.
    record = run(logdir, args, extra)
    record.update(target=args.target, ymax=args.ymax)
    if args.reference:
        record['reference'] = reference_settings(args, logdir)
    (logdir / 'learning.json').write_text(json.dumps(record))
    plot(record, logdir)
    summarize(record)
    print(f'Wrote learning.json to {logdir}.')


def run(logdir, args, extra):
    command = [
        sys.executable, '-m', 'embodied.main', '--configs', *args.configs.split(),
        '--agent_impl', 'dreamerv3', '--script', args.script,
        '--logdir', str(logdir), '--run.duration', str(args.duration), *extra]
    print('Running:', ' '.join(command), flush=True)
    logdir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED='1')
    env.setdefault('JAX_PLATFORMS', 'cpu')
    start = time.monotonic()
    scores = Follower(logdir / 'scores.jsonl')
    metrics = Follower(logdir / 'metrics.jsonl')
    episodes, updates = [], []
    last_print = 0
    with open(logdir / 'benchmark.log', 'w') as log:
        # Tethered (`core.tether`): this command killed, the run stops and
        # saves; a Ctrl-C here does the same.
        proc = tether.popen(command[1:], stdout=log, stderr=subprocess.STDOUT,
                            env=env)
        try:
            while True:
                done = not tether.running(proc)
                now = time.monotonic() - start
                for row in scores.read():
                    if 'episode/score' in row:
                        episodes.append((now, row['step'], row['episode/score']))
                for row in metrics.read():
                    if 'train/opt/updates' in row:
                        updates.append((now, row['step'], row['train/opt/updates']))
                if now - last_print >= args.every or done:
                    last_print = now
                    print(progress_line(now, episodes, updates), flush=True)
                if done:
                    break
                time.sleep(2)
        except KeyboardInterrupt:
            pass
        finally:
            tether.end(proc)
    return dict(
        command=command, returncode=proc.returncode, wall=time.monotonic() - start,
        episodes=episodes, updates=updates)


class Follower:
    """Reads the lines appended to a JSONL file since the last call."""

    def __init__(self, path):
        self.path = path
        self.offset = 0

    def read(self):
        if not self.path.exists():
            return []
        with open(self.path) as f:
            f.seek(self.offset)
            text = f.read()
        end = text.rfind('\n') + 1
        self.offset += len(text[:end].encode())
        return [json.loads(line) for line in text[:end].splitlines() if line]


def load_reference(path):
    """The runs in one of the original's published score files (or the
    shipped DreamerV3 runs of a suite named `path`): a list of {'task',
    'method', 'seed', 'xs' (env steps), 'ys' (episode scores)}."""
    from embodied.plot import published
    if not str(path).endswith('.json.gz') and published.suite_name(str(path)):
        path = published.path(str(path))
    try:
        with gzip.open(path, 'rt') as f:
            runs = json.load(f)
        if not all({'task', 'xs', 'ys'} <= set(r) for r in runs):
            raise ValueError('entries need task, xs and ys')
    except (OSError, ValueError, TypeError) as e:
        raise SystemExit(
            f'--reference {path}: not a published scores file '
            f'(gzipped JSON list of runs): {e}')
    return runs


def reference_settings(args, logdir):
    task = args.reference_task
    if not task:
        import elements
        config = logdir / 'config.yaml'
        if not config.exists():
            raise SystemExit(
                f'--reference: {config} is missing; name the task with '
                f'--reference_task.')
        task = elements.Config.load(str(config))['task']
    return {'path': str(args.reference), 'task': task}


def reference_runs(runs, task):
    """The runs of `task`, under its published name where that differs
    (`embodied.plot.tasks`: Atari 100k games are `atari_<game>` there,
    ball_in_cup `dmc_ball_in_cup_<task>`)."""
    from embodied.plot import tasks
    names = tasks.published_names(task)
    name = tasks.find(task, {r['task'] for r in runs})
    if name:
        return [r for r in runs if r['task'] == name]
    known = sorted({r['task'] for r in runs})
    raise SystemExit(
        f"--reference has no runs of task {task!r} (tried {names}); it has "
        f"{', '.join(known[:8])}{' ...' if len(known) > 8 else ''}; pick one "
        f'with --reference_task.')


def reference_score(runs, lo, hi):
    """The original's score at env steps (lo, hi]: per seed the mean of its
    episodes that ended there (or its last one before `hi`, where none did),
    then the mean over seeds; None before its first episode."""
    values = []
    for r in runs:
        xs, ys = np.asarray(r['xs'], float), np.asarray(r['ys'], float)
        inside = (xs > lo) & (xs <= hi)
        if inside.any():
            values.append(ys[inside].mean())
        elif (xs <= hi).any():
            values.append(ys[xs <= hi][-1])
    return float(np.mean(values)) if values else None


def episode_times(episodes):
    """Wall seconds at which each episode ended. The logger writes scores in
    bursts, so every episode of a burst was seen at the same poll; the times
    are interpolated by env step between the ends of the bursts."""
    seen = np.array([e[0] for e in episodes], float)
    steps = np.array([e[1] for e in episodes], float)
    last_of_burst = np.append(seen[1:] != seen[:-1], True)
    anchor_steps = np.concatenate([[0.0], steps[last_of_burst]])
    anchor_times = np.concatenate([[0.0], seen[last_of_burst]])
    return np.interp(steps, anchor_steps, anchor_times)


def window_scores(episodes):
    scores = np.array([e[2] for e in episodes], float)
    return [scores[max(0, i + 1 - WINDOW):i + 1].mean() for i in range(len(scores))]


def progress_line(now, episodes, updates):
    line = f'{now / 60:6.1f} min'
    if episodes:
        step = episodes[-1][1]
        line += (f' | env step {step:>7} | score {window_scores(episodes)[-1]:6.1f}'
                 f' ({len(episodes)} episodes) | env {step / now:6.1f} steps/s')
    if len(updates) >= 2:
        (t0, _, u0), (t1, _, u1) = updates[0], updates[-1]
        rate = (u1 - u0) / max(t1 - t0, 1e-9)
        line += f' | train {rate:5.2f} steps/s ({int(u1)} updates)'
    return line


def summarize(record):
    episodes = record['episodes']
    if not episodes:
        print('No episodes finished.')
        return
    times = episode_times(episodes)
    steps = np.array([e[1] for e in episodes])
    scores = np.array(window_scores(episodes))
    print(f'Episodes: {len(episodes)}, wall {record["wall"] / 60:.1f} min, '
          f'env steps {steps[-1]}, exit code {record["returncode"]}.')
    reference = record.get('reference')
    header = '   min   env steps   score(last 20)'
    if reference:
        runs = reference_runs(load_reference(reference['path']), reference['task'])
        header += (f'   original {reference["task"]} ({len(runs)} seeds, '
                   f'{os.path.basename(reference["path"])})')
    print(header)
    previous, printed = 0, -1
    # Every 5 minutes, then the end of the run if it has later episodes.
    rows = [(m, f'{m:6d}') for m in range(5, int(record['wall'] / 60) + 1, 5)]
    rows.append((record['wall'] / 60, 'end'))
    for minute, label in rows:
        index = np.searchsorted(times, minute * 60, 'right') - 1
        if index < 0 or (label == 'end' and index == printed):
            continue
        label = f'{minute:6.1f}' if label == 'end' else label
        line = f'{label} {steps[index]:11d} {scores[index]:10.1f}'
        if reference:
            value = reference_score(runs, previous, steps[index])
            text = '-' if value is None else f'{value:.1f}'
            line += f'       {text} (steps {previous}-{steps[index]})'
            previous = steps[index]
        printed = index
        print(line)
    target = record.get('target', TARGET)
    reached = np.nonzero(scores >= target)[0]
    if len(reached):
        i = reached[0]
        print(f'First >= {target:g}: {times[i] / 60:.1f} min, env step '
              f'{steps[i]}.')
    else:
        print(f'Never reached {target:g}.')
    print(f'Best window: {scores.max():.1f}; final window: {scores[-1]:.1f}.')
    print(f'Env steps/s (overall): {steps[-1] / record["wall"]:.1f}.')
    updates = record.get('updates') or []
    if len(updates) >= 2:
        (t0, _, u0), (t1, _, u1) = updates[0], updates[-1]
        print(f'Train steps/s: {(u1 - u0) / max(t1 - t0, 1e-9):.2f} '
              f'({int(u1)} updates).')


def plot(record, logdir):
    """learning.png and learning.svg in the logdir: score against env steps
    and wall time (line: mean per bin, dots: episodes, dashed: target)."""
    from embodied import plot as plotlib
    try:
        paths = plotlib.plot(
            [logdir], name='learning', episodes=True,
            hline=record.get('target', TARGET), ymax=record.get('ymax'))
    except (ImportError, FileNotFoundError, ValueError) as e:
        print(f'No curves drawn: {e}')
        return
    print('Wrote', ', '.join(str(p) for p in paths))


if __name__ == '__main__':
    main()
