"""Agent speed of two source trees: DreamerV3 train steps/s and policy latency.

    python -m embodied.perf.agent_speed                    # ebfdc8b vs this tree
    python -m embodied.perf.agent_speed --old REV --rounds 5 --configs debug

Exports the `--old` git revision (by default the last commit on the previous
JAX agent base) with `git archive` and measures it and this working tree (or
the `--new` revision) in
fresh subprocesses, alternating old and new for `--rounds` rounds so that
load on the machine hits both alike. Each measurement builds the agent with
`embodied.main.make_agent` at `--configs` (default `debug`, with
`--jax.debug False` so XLA optimizes as in a real run), compiles, then times
`--train_steps` train calls on a fixed batch and `--policy_calls` policy
calls on a batch of `run.actor_batch` (at least 1) observations. The table
shows the median and the best round per tree and new/old (the median of the
per-round ratios, and the ratio of the bests).
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
OLD_BASE = 'ebfdc8b'

# Runs in the measured tree (PYTHONPATH points at it), so it may only use what
# both the old and the new `embodied` have.
WORKER = r'''
import json, sys, tempfile, time
import numpy as np
from embodied import main as mainlib

flags, train_steps, policy_calls = json.loads(sys.argv[1])
config = mainlib.parse([
    '--agent_impl', 'dreamerv3', '--logdir', tempfile.mkdtemp(), *flags])
agent = mainlib.make_agent(config)
rng = np.random.default_rng(0)

def sample(space, shape):
    if space.discrete:
        return rng.integers(space.low, space.high, shape + space.shape).astype(
            space.dtype)
    return rng.normal(size=shape + space.shape).astype(space.dtype)

spaces = {**agent.obs_space, **agent.act_space, **agent.ext_space}
B, T = config.batch_size, config.batch_length + config.replay_context
batch = {k: sample(v, (B, T)) for k, v in spaces.items()}
for key in ('is_first', 'is_last', 'is_terminal'):
    batch[key] = np.zeros((B, T), bool)

carry = agent.init_train(B)
start = time.perf_counter()
for _ in range(3):
    carry, _, _ = agent.train(carry, batch)
compile_train = time.perf_counter() - start
start = time.perf_counter()
for _ in range(train_steps):
    carry, _, _ = agent.train(carry, batch)
train_rate = train_steps / (time.perf_counter() - start)

N = max(1, int(config.run.actor_batch))
obs = {k: sample(v, (N,)) for k, v in agent.obs_space.items()}
obs['is_first'] = np.zeros(N, bool)
carry = agent.init_policy(N)
for _ in range(3):
    carry, _, _ = agent.policy(carry, obs)
latencies = []
for _ in range(policy_calls):
    start = time.perf_counter()
    carry, act, _ = agent.policy(carry, obs)
    latencies.append(time.perf_counter() - start)
print('RESULT ' + json.dumps(dict(
    train_rate=train_rate, compile_train=compile_train,
    policy_ms=1000 * float(np.median(latencies)),
    policy_p90_ms=1000 * float(np.percentile(latencies, 90)),
    actor_batch=N, batch=[B, T])))
'''


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--old', default=OLD_BASE,
                        help='git revision of the old tree')
    parser.add_argument('--new', default='',
                        help='git revision of the new tree (default: this '
                             'working tree)')
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--train_steps', type=int, default=100)
    parser.add_argument('--policy_calls', type=int, default=300)
    parser.add_argument('--configs', default='debug')
    parser.add_argument('--markdown', default='',
                        help='also write the table to this file')
    args, extra = parser.parse_known_args(argv)
    flags = [
        '--configs', *args.configs.split(), '--jax.debug', 'False',
        *[x for x in extra if x != '--']]
    with tempfile.TemporaryDirectory() as tmp:
        old_tree = export(args.old, pathlib.Path(tmp) / 'old')
        if args.new:
            new_tree = export(args.new, pathlib.Path(tmp) / 'new')
            trees = {f'old ({args.old})': old_tree,
                     f'new ({args.new})': new_tree}
        else:
            trees = {f'old ({args.old})': old_tree, 'new (this tree)': ROOT}
        results = {name: [] for name in trees}
        for index in range(args.rounds):
            for name, tree in trees.items():
                result = measure(tree, flags, args)
                results[name].append(result)
                print(f'round {index + 1}/{args.rounds} {name}: '
                      f'{result["train_rate"]:.1f} train steps/s, policy '
                      f'{result["policy_ms"]:.2f} ms', flush=True)
    table = render(results, flags)
    print(table)
    if args.markdown:
        pathlib.Path(args.markdown).write_text(table + '\n')


def export(revision, path):
    path.mkdir(parents=True)
    archive = subprocess.run(
        ['git', '-C', str(ROOT), 'archive', revision], check=True,
        capture_output=True).stdout
    subprocess.run(['tar', '-x', '-C', str(path)], input=archive, check=True)
    return path


def measure(tree, flags, args):
    env = dict(os.environ, PYTHONPATH=str(tree), JAX_PLATFORMS='cpu')
    payload = json.dumps([flags, args.train_steps, args.policy_calls])
    result = subprocess.run(
        [sys.executable, '-c', WORKER, payload], cwd=str(tree), env=env,
        capture_output=True, text=True, timeout=1800)
    lines = [x for x in result.stdout.splitlines() if x.startswith('RESULT ')]
    if result.returncode or not lines:
        raise RuntimeError(
            f'Measuring {tree} failed (exit {result.returncode}):\n'
            f'{result.stderr[-3000:]}')
    return json.loads(lines[-1][len('RESULT '):])


def render(results, flags):
    """Medians over rounds, the best round (least disturbed by other load on
    the machine), and new/old: the median of the per-round ratios (each
    round measures old and new back to back) and the ratio of the bests."""
    names = list(results)
    keys = ('train_rate', 'policy_ms', 'policy_p90_ms', 'compile_train')
    medians = {
        name: {key: statistics.median(r[key] for r in rows) for key in keys}
        for name, rows in results.items()}
    best = {
        name: {'train_rate': max(r['train_rate'] for r in rows),
               'policy_ms': min(r['policy_ms'] for r in rows)}
        for name, rows in results.items()}
    first = results[names[0]][0]
    lines = [
        f'DreamerV3 agent speed, flags: {" ".join(flags)}; train batch '
        f'{first["batch"][0]}x{first["batch"][1]}, policy batch '
        f'{first["actor_batch"]}; {len(results[names[0]])} alternating rounds',
        '',
        '| tree | train steps/s (median) | train steps/s (best) | '
        'policy ms (median) | policy ms (best) | policy ms (p90) | '
        'compile + 3 steps s |',
        '|---|---|---|---|---|---|---|']
    for name in names:
        m, b = medians[name], best[name]
        lines.append(
            f'| {name} | {m["train_rate"]:.1f} | {b["train_rate"]:.1f} | '
            f'{m["policy_ms"]:.2f} | {b["policy_ms"]:.2f} | '
            f'{m["policy_p90_ms"]:.2f} | {m["compile_train"]:.1f} |')
    if len(names) == 2:
        old, new = results[names[0]], results[names[1]]
        paired = lambda key: statistics.median(
            n[key] / o[key] for o, n in zip(old, new))
        bo, bn = best[names[0]], best[names[1]]
        lines.append(
            f'| new / old | {paired("train_rate"):.3f} (paired) | '
            f'{bn["train_rate"] / bo["train_rate"]:.3f} | '
            f'{paired("policy_ms"):.3f} (paired) | '
            f'{bn["policy_ms"] / bo["policy_ms"]:.3f} | '
            f'{paired("policy_p90_ms"):.3f} (paired) | |')
    return '\n'.join(lines)


if __name__ == '__main__':
    main()
