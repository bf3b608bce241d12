"""Save and restore times of the agent's checkpoint: the pickle saves of an
earlier revision against the saves of this tree (JSON structure plus a
safetensors file), on the same data, in one process; and the size of the
one-file export (`python -m embodied.export`).

    python -m devtools.save_format                     # size12m, default size
    python -m devtools.save_format --sets debug --repeats 3 --old 20df691

For each set (`embodied.perf.param_transfer.SETS`: debug, size12m, and the
default size200m at Atari's spaces) the names, shapes and dtypes of every
entry of DreamerV3's `agent.save()` (parameters, optimizer state, random
streams) come from an abstract trace of its init (no compile); arrays of
those shapes are filled with random numbers in host memory, as
`agent.save()` returns them. Then, `--repeats` times, alternating the two
formats so that a busy machine weighs on both alike:

- save: `checkpoint.write` of that dict into a new save folder (every file
  written and fsynced, the folder renamed into place), with the old
  revision's `embodied/core/checkpoint.py` (loaded from `git archive
  --old`) and with this tree's;
- restore: `checkpoint.read` of the folder just written, back to a dict of
  numpy arrays, in a fresh process as a resume reads it (one that restored
  before reuses the memory it freed), from the page cache (the files were
  just written).

What the agent adds on either side, `jax.device_get` in `save()` and
`jax.device_put` in `load()`, is the same for both formats and left out.
Medians and minimums are printed as a table (`--markdown FILE` writes
it), with the ratios new / old. The export's size is that of the policy's parameters and
random streams (`policy_keys`) with the set's config, written by
`embodied.export.write`.
"""

import argparse
import importlib.util
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from embodied.perf import checkout as revisions  # noqa: E402

OLD = '20df691'  # The last revision that saved pickles.


def make_parser():
    parser = argparse.ArgumentParser(
        description=' '.join(__doc__.split('\n\n')[0].split()))
    parser.add_argument('--sets', nargs='+', default=['size12m', 'default'])
    parser.add_argument('--old', default=OLD,
                        help='git revision of the pickle format')
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--folder', default='',
                        help='where the saves are written (default: a '
                        'temporary folder)')
    parser.add_argument('--markdown', default='')
    # One restore in a process of its own (see `restore_seconds`).
    parser.add_argument('--restore', default='', help=argparse.SUPPRESS)
    parser.add_argument('--tree', default='', help=argparse.SUPPRESS)
    return parser


def main(argv=None):
    args = make_parser().parse_args(argv)
    if args.restore:
        return restore_child(args.restore, args.tree)
    from embodied.perf import param_transfer
    unknown = [s for s in args.sets if s not in param_transfer.SETS]
    if unknown:
        print(f'--sets: unknown {unknown}; choose from '
              f'{sorted(param_transfer.SETS)}', file=sys.stderr)
        return 2
    work = pathlib.Path(tempfile.mkdtemp(
        prefix='save-format-', dir=args.folder or None))
    try:
        old = load_old_checkpoint(args.old, work / 'tree')
        from embodied.core import checkpoint as new
        rows = []
        for name in args.sets:
            blocks = param_transfer.SETS[name]
            shapes, policy_keys = param_transfer.state_shapes(blocks, 'cpu')
            data = make_data(shapes)
            figures = measure(
                {'old': old, 'new': new}, data, work / name, args.repeats)
            figures['export'] = export_size(
                blocks, shapes, policy_keys, work / f'{name}.safetensors')
            figures['mib'] = nbytes(data) / 2**20
            figures['arrays'] = len(data)
            rows.append((name, figures))
            print(f'{name}: {format_row(figures)}', flush=True)
            del data
        table = render(args, rows)
        print(table)
        if args.markdown:
            pathlib.Path(args.markdown).write_text(table + '\n')
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def load_old_checkpoint(revision, folder):
    """`embodied/core/checkpoint.py` of git `revision` (with the modules it
    imports from its package), as a module beside this tree's."""
    return checkpoint_module(revisions.export(revision, folder))


def checkpoint_module(tree):
    """`embodied/core/checkpoint.py` of the exported `tree`, as a module
    beside this tree's."""
    tree = pathlib.Path(tree)
    package = types.ModuleType('_old_core')
    package.__path__ = [str(tree / 'embodied' / 'core')]
    sys.modules['_old_core'] = package
    spec = importlib.util.spec_from_file_location(
        '_old_core.checkpoint', tree / 'embodied' / 'core' / 'checkpoint.py')
    module = importlib.util.module_from_spec(spec)
    sys.modules['_old_core.checkpoint'] = module
    spec.loader.exec_module(module)
    return module


def make_data(shapes):
    """What `agent.save()` returns for these shapes: random arrays, and
    the random streams' positions."""
    rng = np.random.default_rng(0)
    data = {}
    for key, (shape, dtype) in shapes.items():
        if np.issubdtype(dtype, np.floating):
            data[key] = rng.standard_normal(shape, np.float32).astype(dtype)
        else:
            data[key] = rng.integers(0, 100, shape).astype(dtype)
    for stream in ('init', 'policy', 'train', 'report'):
        data[f'rng/{stream}'] = np.int64(rng.integers(1000))
    data['rng/seed'] = np.int64(0)
    return data


def nbytes(data):
    return sum(np.asarray(v).nbytes for v in data.values())


def measure(modules, data, folder, repeats):
    """Median seconds of each module's save and restore, and its files'
    size in MiB."""
    times = {f'{n} {what}': [] for n in modules for what in ('save', 'restore')}
    sizes = {}
    for repeat in range(repeats):
        order = list(modules.items())
        if repeat % 2:
            order.reverse()
        for name, module in order:
            path = folder / name / f'{repeat:012d}'
            start = time.perf_counter()
            module.write(path, {'agent': lambda: data})
            times[f'{name} save'].append(time.perf_counter() - start)
            sizes[name] = sum(
                os.path.getsize(path / f) for f in os.listdir(path)) / 2**20
            times[f'{name} restore'].append(
                restore_seconds(module, path, len(data)))
            shutil.rmtree(path)
    figures = {k: statistics.median(v) for k, v in times.items()}
    figures.update({f'{k} min': min(v) for k, v in times.items()})
    figures.update({f'{n} files': v for n, v in sizes.items()})
    return figures


def restore_seconds(module, path, count):
    """Seconds of `module.read` of the save `path` in a fresh process, as
    a resume reads it (a process that restored before would reuse the
    memory it freed)."""
    # An exported revision's module lies at TREE/embodied/core/.
    tree = '' if module.__name__.startswith('embodied.') else str(
        pathlib.Path(module.__file__).parents[2])
    result = subprocess.run(
        [sys.executable, '-m', 'devtools.save_format', '--restore', str(path),
         '--tree', tree], cwd=ROOT, capture_output=True, text=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(ROOT), os.environ.get('PYTHONPATH', '')])))
    if result.returncode:
        raise RuntimeError(f'restore of {path} failed: {result.stderr}')
    seconds, entries = result.stdout.split()[-2:]
    assert int(entries) == count, (entries, count)
    return float(seconds)


def restore_child(path, tree):
    """Prints the seconds of one read of the save `path` and its entries:
    with the checkpoint module of the exported `tree`, or this tree's."""
    if tree:
        module = checkpoint_module(tree)
    else:
        from embodied.core import checkpoint as module
    loaded = []
    start = time.perf_counter()
    module.read(path, {'agent': loaded.append})
    print(time.perf_counter() - start, len(loaded[0]))
    return 0


def export_size(blocks, shapes, policy_keys, file):
    """Bytes of the policy file of these shapes (zeros) with the set's
    config, as `python -m embodied.export` writes it."""
    import re
    from embodied import export
    from embodied import main as mainlib
    from embodied.core import savetree
    config = mainlib.parse(['--configs', *blocks, '--jax.platform', 'cpu',
                            '--logdir', '/tmp/unused-save-format'])
    pattern = re.compile(f'(?:{policy_keys})|^rng/')
    data = {k: np.zeros(s, d) for k, (s, d) in shapes.items()
            if pattern.search(k)}
    data.update({f'rng/{k}': np.int64(0) for k in (
        'init', 'policy', 'train', 'report', 'seed')})
    tree, arrays = savetree.split(data, 'agent')
    meta = {'format': export.FORMAT, 'version': export.VERSION,
            'agent': config.agent_impl, 'config': dict(config.flat),
            'tree': tree}
    size = export.write(file, meta, arrays)
    os.remove(file)
    return size


def format_row(figures):
    return ', '.join(
        f'{k} {v:.3f} s' if k.endswith(('save', 'restore')) else
        f'{k} {v:.1f}' for k, v in figures.items())


def render(args, rows):
    lines = [
        f'Agent checkpoint save and restore, seconds, median and minimum '
        f'of {args.repeats} (old: pickle, revision {args.old}; new: JSON + '
        f'safetensors)',
        '',
        '| set | state | format | save s | restore s | save s (min) | '
        'restore s (min) | files |',
        '|---|---|---|---|---|---|---|---|']
    for name, f in rows:
        state = f"{size_text(f['mib'])}, {f['arrays']} arrays"
        for fmt in ('old', 'new'):
            lines.append(
                f"| {name} | {state} | {fmt} | {f[f'{fmt} save']:.3f} | "
                f"{f[f'{fmt} restore']:.3f} | {f[f'{fmt} save min']:.3f} | "
                f"{f[f'{fmt} restore min']:.3f} | "
                f"{size_text(f[f'{fmt} files'])} |")
        ratios = [f[f'new {k}'] / f[f'old {k}'] for k in (
            'save', 'restore', 'save min', 'restore min')]
        lines.append(f"| {name} | | new / old | " + ' | '.join(
            f'{r:.2f}x' for r in ratios) + ' | |')
    lines += ['', '| set | exported policy file |', '|---|---|']
    for name, f in rows:
        lines.append(f"| {name} | {size_text(f['export'] / 2**20)} "
                     f"({f['export']:,} bytes) |")
    return '\n'.join(lines)


def size_text(mib):
    return f'{mib * 1024:.1f} KiB' if mib < 1 else f'{mib:.1f} MiB'



if __name__ == '__main__':
    sys.exit(main())
