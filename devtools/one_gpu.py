"""The parallel runner on a CPU model of one GPU: how busy the device is
kept, how fast the learner trains, and how long the policy waits.

    python -m devtools.one_gpu                           # 8 16 32 64 envs
    python -m devtools.one_gpu --envs 16                 # thread, process
    python -m devtools.one_gpu --old b7d4394 --rounds 2 --envs 16
    python -m devtools.one_gpu --train_ms 49 --policy_ms 2.1 --env_ms 5
    python -m devtools.one_gpu --envs 16 --run.actor_batch 16

Each run is `python -m embodied.run.parallel --script parallel` with the
test agent on one simulated serial device (`simulated_gpu.py`): `train`
submits `--train_ms` of work and returns at once, the policy submits
`--policy_ms` and waits for it, and the device runs what it is given first
in, first out, as JAX runs the programs for one GPU on one stream. Each env
step takes `--env_ms` (the env itself, e.g. Atari with action repeat and
resizing). The runner's other settings are those of the GPU run it models
(`--configs atari size12m --run.envs 16 --run.eval_envs 0` on an H200):
train ratio 32, batch 16 x 64, half the envs per policy batch, two actor
threads, one env per worker process.

Each setting runs in both modes of `run.policy_process` (`--modes`):
`thread`, the policy in the agent's process, its calls on the learner's
stream; `process`, the policy in a process of its own, a second context
on the device that takes turns with the learner's in time slices of
`--slice_ms`, where of a policy call's `--policy_ms` only
`--policy_device_ms` runs on the device (the rest is the host's, beside
the learner's programs), and the learner's parameters reach it through
a copy to the host and one to its device (`--copy_ms` each). These two
times are calibrated to `gpu_check`'s probe of a policy in a second
process on the H200: the table's head gives the probe run on the model
beside the H200's figures. A tree without the key `run.policy_process`
gets no process row.

Columns, over the steady window (from `--warmup` seconds after the first
progress line to the stop decision): env steps/s; the learner's updates/s
as % of the device's standalone rate (1000 / train_ms); the device busy %;
the policy's wait inside the runner (from its call to its result, device
queue included) and the runner's own policy batch ms (first request of a
batch to its reply, `[Summary]`); the policy lag (updates the acting
parameters were behind, mean over policy calls). Flags the benchmark does
not know go to the runner.

Side by side with a git revision (`--old REV`), rounds alternate which tree
runs first, as in `throughput`. The simulated agent and its env hook run
from a temporary folder on PYTHONPATH, so an older tree needs neither.
"""

import argparse
import json
import os
import pathlib
import re
import shutil
import statistics
import tempfile

from embodied.perf import checkout as revisions
from devtools import simulated_gpu
from embodied.perf import throughput

# The H200 run this model reproduces (atari size12m, 16 envs; the rows of
# docs/benchmarks.md, One GPU).
H200 = dict(env_fps=476, learner=72.0, policy_batch_ms=26.4)
# gpu_check's probe on the H200 (docs/benchmarks.md, One GPU): a policy
# process's calls at batch 16 while another process trains back to back.
H200_PROBE = dict(p50=2.66, p95=3.16, learner=91)
FLAGS = (
    '--agent_impl', 'simulated_gpu:SimulatedGPUAgent',
    '--batch_size', '16', '--batch_length', '64',
    '--run.train_ratio', '32', '--run.actor_batch', '-1',
    '--run.log_every', '2', '--replay.size', '1e5',
    '--testing.check_content', 'False')
SITECUSTOMIZE = (
    '# Written by devtools.one_gpu: slows the dummy env in every\n'
    '# process of the run (see simulated_gpu.install).\n'
    'import simulated_gpu\nsimulated_gpu.install()\n')


def make_parser():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--envs', type=int, nargs='+', default=[8, 16, 32, 64])
    parser.add_argument('--train_ms', type=float, default=49.0)
    parser.add_argument('--policy_ms', type=float, default=2.1)
    parser.add_argument(
        '--policy_rows', type=int, default=16,
        help='rows a policy call takes --policy_ms for, at most')
    parser.add_argument(
        '--policy_scale', type=float, default=1.0,
        help='above --policy_rows, each extra row adds this fraction of '
             'policy_ms / policy_rows')
    parser.add_argument('--env_ms', type=float, default=1.0)
    parser.add_argument('--copy_ms', type=float, default=0.05)
    parser.add_argument(
        '--modes', nargs='+', default=['thread', 'process'],
        choices=['thread', 'process'], help='run.policy_process modes')
    parser.add_argument(
        '--policy_device_ms', type=float, default=0.24,
        help='of --policy_ms, the device part of a call in a policy process')
    parser.add_argument(
        '--slice_ms', type=float, default=1.1,
        help="the device's time slice between two processes' contexts")
    parser.add_argument(
        '--split', type=float, nargs='+', default=[1.0],
        help='the update as several programs, as fractions of train_ms, '
             'each submitted once the one before has run')
    parser.add_argument(
        '--host_policy_ms', type=float, default=0.0,
        help='> 0: the policy on the host for this long, off the device')
    parser.add_argument('--copy_every', type=int, default=1)
    parser.add_argument(
        '--dilate', type=float, default=2.0,
        help='every simulated time (device items, env steps) runs this '
             'many times slower, and the figures are scaled back, so that '
             'this machine\'s own runner overhead counts 1/dilate as much '
             '(2 calibrates the 2-core machine to the H200 run)')
    parser.add_argument('--seconds', type=float, default=60)
    parser.add_argument('--warmup', type=float, default=10)
    parser.add_argument('--old', type=str, default='')
    parser.add_argument('--rounds', type=int, default=0)
    parser.add_argument('--markdown', type=str, default='')
    return parser


def main(argv=None):
    parser = make_parser()
    # Flags it does not know go to the runner (of every tree), e.g.
    # `--run.actor_batch 16`.
    args, args.runner_flags = parser.parse_known_args(argv)
    if abs(sum(args.split) - 1) > 1e-6:
        parser.error(f'--split {args.split}: the fractions must add up to 1.')
    rounds = args.rounds or (2 if args.old else 1)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        hook = tmp / 'hook'
        hook.mkdir()
        shutil.copy(simulated_gpu.__file__, hook / 'simulated_gpu.py')
        (hook / 'sitecustomize.py').write_text(SITECUSTOMIZE)
        trees = revisions.trees(args.old, tmp)
        results = {}
        for index in range(rounds):
            order = list(trees.items())
            if index % 2:
                order.reverse()
            for envs in args.envs:
                for mode in args.modes:
                    for tree, root in order:
                        run_one(args, (index, rounds), (tree, root), envs,
                                mode, (hook, tmp), results)
    table = markdown(args, results, list(trees))
    print(table)
    if args.markdown:
        pathlib.Path(args.markdown).write_text(table + '\n')


def run_one(args, rounds, tree, envs, mode, folders, results):
    """One run of a round; its figures go to `results[tree, envs, mode]`
    and a line to the output."""
    (index, count), (tree, root) = rounds, tree
    name = f'@{tree}' if tree else 'working tree'
    label = f'round {index + 1}/{count} {name}: {envs} envs, {mode}'
    if mode == 'process' and not knows_policy_process(root):
        results[tree, envs, mode] = NO_KEY
        print(f'{label}: {NO_KEY}', flush=True)
        return
    try:
        row = measure(args, envs, mode, root, *folders)
    except RuntimeError as e:
        print(f'{label}: failed: {e}', flush=True)
        return
    results.setdefault((tree, envs, mode), []).append(row)
    print(f'{label}: {format_cells(row)}', flush=True)


NO_KEY = 'not run: the tree has no run.policy_process'


def knows_policy_process(root):
    """Whether the tree at `root` has the key `run.policy_process` (since
    renamed `run.policy_worker`, which still takes the old name)."""
    defaults = pathlib.Path(root) / 'configs' / 'defaults.yaml'
    return defaults.exists() and re.search(
        r'^\s+policy_(process|worker):', defaults.read_text(),
        re.M) is not None


def measure(args, envs, mode, root, hook, tmp):
    """One run at `envs` envs in `mode` in the tree at `root`; its
    figures."""
    name = f'{os.getpid()}-{envs}-{mode}'
    trace = tmp / f'trace-{name}.jsonl'
    trace.unlink(missing_ok=True)
    k = args.dilate
    options = dict(
        train_ms=k * args.train_ms, policy_ms=k * args.policy_ms,
        policy_rows=args.policy_rows, policy_scale=args.policy_scale,
        report_ms=k * args.train_ms, copy_ms=k * args.copy_ms,
        split=args.split,
        host_policy_ms=k * args.host_policy_ms, copy_every=args.copy_every,
        trace=str(trace), slice_ms=k * args.slice_ms,
        policy_device_ms=k * args.policy_device_ms)
    mode_flags = ()
    if knows_policy_process(root):
        mode_flags = ('--run.policy_process', mode)
    if mode == 'process':
        # The learner's process serves the device; the policy process's
        # agent is a second context on it.
        options.update(
            policy_process=True, device_socket=str(tmp / f'device-{name}'))
    env = {
        simulated_gpu.OPTIONS: json.dumps(options),
        simulated_gpu.ENV_MS: str(k * args.env_ms),
        'PYTHONPATH': str(hook)}
    with tempfile.TemporaryDirectory(dir=tmp) as logdir:
        output, _, _, lines, _ = throughput.launch(
            root, 'embodied.run.parallel', args.seconds,
            '--script', 'parallel', '--logdir', os.path.join(logdir, 'run'),
            *FLAGS, '--run.envs', envs, *mode_flags, *args.runner_flags,
            env=env)
    snapshots = [json.loads(line) for line in trace.read_text().splitlines()
                 if line.strip()]
    return figures(args, output, lines, snapshots)


def figures(args, output, lines, snapshots):
    """The row's figures over the steady window; see the module docstring."""
    window = steady_window(lines, args.warmup)
    if window is None or len(snapshots) < 2:
        raise RuntimeError(
            f'no steady window of progress lines and device counters:\n'
            f'{output[-2000:]}')
    (t0, step0), (t1, step1) = window
    k = args.dilate  # Simulated times ran k times slower: scale back.
    a, b = at(snapshots, t0), at(snapshots, t1)
    seconds = t1 - t0
    split = len(args.split)
    diff = lambda *key: value(b, *key) - value(a, *key)
    updates = diff('items', 'train') / split
    calls = diff('policy_calls')
    summary = re.findall(r'\[Summary\] (.*)', output)
    values = dict(x.split('=') for x in summary[-1].split()) if summary else {}
    return dict(
        env_fps=k * (step1 - step0) / seconds,
        learner=100 * updates / seconds / (1000 / (k * args.train_ms)),
        busy=100 * sum(diff('busy', kind) for kind in b['busy']) / seconds,
        policy_wait_ms=1000 * diff('policy_seconds') / max(1, calls) / k,
        policy_batch_ms=float(values.get('policy_batch_ms', 'nan')) / k,
        policy_rows=diff('policy_rows') / max(1, calls),
        lag=diff('lag_sum') / max(1, calls))


def steady_window(lines, warmup):
    """((time, step), (time, step)): the first progress line at least
    `warmup` seconds after the first one, and the stop decision."""
    points, stop = [], None
    for when, line in lines:
        match = re.search(r'\[Progress\] step (\d+)/', line)
        if match:
            points.append((when, int(match.group(1))))
        match = re.search(r' at step (\d+): saving and stopping', line)
        if match:
            stop = (when, int(match.group(1)))
            break
    if not points or stop is None:
        return None
    start = next(
        (p for p in points if p[0] >= points[0][0] + warmup), None)
    if start is None or stop[0] - start[0] < 2.0:
        return None
    return start, stop


def value(snapshot, *key):
    for part in key:
        snapshot = snapshot.get(part, 0) if isinstance(snapshot, dict) else 0
    return snapshot


def at(snapshots, when):
    """The counters at `when`, linear between the snapshots around it."""
    flat = [(s['time'], _flatten(s)) for s in snapshots]
    for (ta, a), (tb, b) in zip(flat, flat[1:]):
        if ta <= when <= tb:
            w = 0 if tb == ta else (when - ta) / (tb - ta)
            return _unflatten({k: a.get(k, 0) + w * (b.get(k, 0) - a.get(k, 0))
                               for k in {*a, *b}})
    raise RuntimeError(
        f'the device counters do not cover the moment {when:.1f} '
        f'({flat[0][0]:.1f} to {flat[-1][0]:.1f})')


def _flatten(snapshot):
    flat = {}
    for key, val in snapshot.items():
        if isinstance(val, dict):
            flat.update({f'{key}/{k}': v for k, v in val.items()})
        elif key != 'time':
            flat[key] = val
    return flat


def _unflatten(flat):
    nested = {}
    for key, val in flat.items():
        outer, _, inner = key.partition('/')
        if inner:
            nested.setdefault(outer, {})[inner] = val
        else:
            nested[outer] = val
    nested.setdefault('busy', {})
    return nested


COLUMNS = (
    ('env_fps', 'env steps/s', 0), ('learner', 'learner % of standalone', 1),
    ('busy', 'device busy %', 1), ('policy_wait_ms', 'policy wait ms', 1),
    ('policy_batch_ms', 'policy batch ms', 1),
    ('policy_rows', 'rows per policy call', 1), ('lag', 'policy lag', 2))


def format_cells(row):
    return ', '.join(
        f'{title} {row[key]:.{digits}f}' for key, title, digits in COLUMNS)


def markdown(args, results, trees):
    """Per envs setting, mode and tree: the median of each figure over the
    rounds, with the H200 run and, for the process mode, the probe on the
    model, for calibration."""
    lines = [
        f'One simulated GPU: train {args.train_ms:g} ms, policy '
        f'{args.policy_ms:g} ms (up to {args.policy_rows} rows; '
        f'{args.policy_device_ms:g} ms of it on the device in a policy '
        f'process), time slice {args.slice_ms:g} ms, env step '
        f'{args.env_ms:g} ms, time dilated {args.dilate:g}x, update split '
        f'{args.split}, host policy {args.host_policy_ms:g} ms, '
        f'runner flags {" ".join(args.runner_flags) or "none"}; medians over '
        f'the rounds.']
    if 'process' in args.modes:
        probe = simulated_gpu.probe(
            args.train_ms, args.policy_ms, args.policy_device_ms,
            args.slice_ms, calls=2000)
        lines.append(
            f"The probe on the model: a policy process's call p50 "
            f"{probe['p50']:.2f} ms, p95 {probe['p95']:.2f} ms, the learner "
            f"beside it at {probe['learner']:.1f}% of standalone (H200: "
            f"{H200_PROBE['p50']} ms, {H200_PROBE['p95']} ms, "
            f"{H200_PROBE['learner']}%).")
    titles = ' | '.join(title for _, title, _ in COLUMNS)
    lines += ['', f'| tree | envs | mode | {titles} |',
              '|' + '---|' * (len(COLUMNS) + 3)]
    lines.append(
        f"| H200 run (atari size12m) | 16 | thread | {H200['env_fps']} | "
        f"{H200['learner']} | – | – | {H200['policy_batch_ms']} | 8 | – |")
    for envs in args.envs:
        for mode in args.modes:
            for tree in trees:
                lines.append(table_row(results, tree, envs, mode))
    return '\n'.join(lines)


def table_row(results, tree, envs, mode):
    rows = results.get((tree, envs, mode))
    name = tree or 'working tree'
    if rows == NO_KEY:
        return f'| {name} | {envs} | {mode} | {NO_KEY} |'
    if not rows:
        return f'| {name} | {envs} | {mode} | failed |'
    cells = [f'{statistics.median(r[k] for r in rows):.{d}f}'
             for k, _, d in COLUMNS]
    return f'| {name} | {envs} | {mode} | ' + ' | '.join(cells) + ' |'


if __name__ == '__main__':
    main()
