"""Speed of the `Prioritized` replay selector: this tree against an earlier
git revision, in one process, rounds interleaved.

    python -m devtools.selector_bench [--old 20df691] [--items 10000]
        [--length 64] [--draws 10000] [--rounds 9]

Each revision's `embodied/core` modules are loaded under a name of their
own (only `selectors` and what it imports, not the package), so both run
side by side in one process, in alternating order. A selector holds
`--items` items of `--length` steps that overlap as a replay's do (item i
holds steps i .. i + length - 1), each with its own random priority.
Rows, in microseconds
of this process's CPU time per call (`time.process_time`: on a shared
machine wall time counts the other jobs too), in the fastest round (the
one least disturbed by other jobs) and the median round:

* `sample`: one draw (`selector()`);
* `prioritize`: one update of a batch of 16 x 64 steps' priorities (the
  learner's `replay` output at batch 16, length 64);
* `insert + remove`: a new item added and the oldest evicted.

`new/old` is the working tree's time over the old revision's, of the
fastest and of the median rounds: below 1 is faster.
"""

import argparse
import importlib
import pathlib
import sys
import tempfile
import time
import types

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
PRIORITIZE_BATCH = (16, 64)


def load_selectors(tree, name):
    """`embodied/core/selectors.py` of `tree`, imported as `name.selectors`
    with its relative imports resolved inside that tree's `core`."""
    for loaded in [m for m in sys.modules if m.split('.')[0] == name]:
        del sys.modules[loaded]  # A tree loaded before under this name.
    package = types.ModuleType(name)
    package.__path__ = [str(pathlib.Path(tree) / 'embodied' / 'core')]
    sys.modules[name] = package
    return importlib.import_module(f'{name}.selectors')


def stepid(step):
    ids = np.zeros((len(step), 20), np.uint8)
    ids[:, :8] = np.asarray(step, np.uint64)[:, None].view(np.uint8)
    return ids


def build(selectors, items, length, seed=0):
    selector = selectors.Prioritized(exponent=0.8, maxfrac=0.1, seed=seed)
    for key in range(items):
        selector[key] = stepid(np.arange(key, key + length))
    steps = np.arange(items + length - 1)
    prios = np.random.default_rng(seed).uniform(0.1, 10, len(steps))
    selector.prioritize(stepid(steps), prios)
    return selector


def time_sample(selector, draws):
    start = time.process_time()
    for _ in range(draws):
        selector()
    return (time.process_time() - start) / draws


def time_prioritize(selector, items, length, calls):
    rng = np.random.default_rng(1)
    batches = []
    for _ in range(calls):
        starts = rng.integers(0, items, PRIORITIZE_BATCH[0])
        steps = (starts[:, None] + np.arange(PRIORITIZE_BATCH[1])).reshape(-1)
        batches.append((stepid(steps), rng.uniform(0.1, 10, len(steps))))
    start = time.process_time()
    for ids, prios in batches:
        selector.prioritize(ids, prios)
    return (time.process_time() - start) / calls


def time_churn(selector, items, length, calls):
    ids = [stepid(np.arange(key, key + length))
           for key in range(items, items + calls)]
    start = time.process_time()
    for offset, stepids in enumerate(ids):
        selector[items + offset] = stepids
        del selector[offset]
    return (time.process_time() - start) / calls


def measure(selectors, args):
    selector = build(selectors, args.items, args.length)
    return {
        'sample': time_sample(selector, args.draws),
        'prioritize': time_prioritize(
            selector, args.items, args.length, max(1, args.draws // 200)),
        'insert + remove': time_churn(
            selector, args.items, args.length, max(1, args.draws // 10)),
    }


def table(labels, results):
    old, new = labels
    lines = [
        f'| op (CPU us per call) | {old} | {new} | new/old, fastest '
        f'| new/old, median |',
        '|---|---|---|---|---|']
    for op in results[old]:
        a, b = (np.array(results[x][op]) * 1e6 for x in labels)
        cells = [
            f'{x.min():.1f} (median {np.median(x):.1f})' for x in (a, b)]
        lines.append(
            f'| {op} | {cells[0]} | {cells[1]} | {b.min() / a.min():.3f} | '
            f'{np.median(b) / np.median(a):.3f} |')
    return '\n'.join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--old', default='20df691',
                        help='the git revision to compare with')
    parser.add_argument('--items', type=int, default=10000)
    parser.add_argument('--length', type=int, default=64)
    parser.add_argument('--draws', type=int, default=10000)
    parser.add_argument('--rounds', type=int, default=9)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from embodied.perf import checkout as revisions
    with tempfile.TemporaryDirectory() as tmp:
        trees = revisions.trees(args.old, tmp)
        labels = [args.old, 'working tree']
        modules = {
            label: load_selectors(tree, f'_selector_bench_{i}')
            for i, (label, tree) in enumerate(zip(labels, trees.values()))}
        results = {label: {} for label in labels}
        for round_ in range(args.rounds):
            # Alternating order, so a slow spell weighs on both alike.
            for label in labels[::1 if round_ % 2 == 0 else -1]:
                for op, seconds in measure(modules[label], args).items():
                    results[label].setdefault(op, []).append(seconds)
    print(f'Prioritized: {args.items} items of {args.length} steps, '
          f'{args.draws} draws a round, {args.rounds} rounds')
    print(table(labels, results))


if __name__ == '__main__':
    main()
