"""Compiled program size: what the GPU compiler sees of the agent's train
and report programs, measured on a CPU-only machine.

    python -m devtools.compile_size                      # atari size12m
    python -m devtools.compile_size --configs debug
    EMBODIED_ORIGINAL_DREAMERV3=/path/to/dreamerv3 \\
        python -m devtools.compile_size --markdown table.md

Setups, each built in a fresh subprocess on the CPU: `ours` (this base with
our DreamerV3) and `ours+orig agent` (this base with the original's
`dreamerv3/agent.py` and `rssm.py` unchanged; needs the checkout in
$EMBODIED_ORIGINAL_DREAMERV3). Each builds the agent at `--configs` with
`--jax.compute_dtype bfloat16` (what `auto` picks on a GPU), then exports
the jitted train and report functions for the `cuda` platform (as
`jax.export` does; no GPU needed) and reads the StableHLO text.

Per program the table gives, with called functions inlined as XLA does:
the number of `dot_general`, `convolution`, `while` and `custom_call` ops
and of all ops; the number of distinct dot and convolution signatures
(operand types and dimension numbers: each is a separate matmul or
convolution the GPU autotuner times); the distinct dots in context (a dot
signature with the ops that make its operands and use its result, which
XLA may fuse into one kernel, so the same matmul in other surroundings is
timed again); how often the most repeated dot
signature occurs (Python loops unrolled into the program repeat the same
matmul once per step, where `scan` has it once in a `while` body); the
trip counts of the `while` loops; matmul and convolution flops counted
from the ops with loop bodies times their trip counts; and XLA's
`cost_analysis()` flops and bytes of the lowered program, which count a
loop body once.
"""

import argparse
import collections
import json
import math
import os
import pathlib
import re
import subprocess
import sys
import tempfile

from embodied.perf import checkout as original

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROGRAMS = ('train', 'report')

COLUMNS = (
    ('dot_general', 'dot_general', '{:,}'),
    ('dot_signatures', 'distinct dots', '{:,}'),
    ('dot_max_repeat', 'most repeated dot', '{:,}'),
    ('dot_contexts', 'distinct dots in context', '{:,}'),
    ('convolution', 'convolution', '{:,}'),
    ('conv_signatures', 'distinct convs', '{:,}'),
    ('while', 'while', '{:,}'),
    ('trips', 'while trips', '{}'),
    ('custom_call', 'custom_call', '{:,}'),
    ('ops', 'all ops', '{:,}'),
    ('matmul_gflops', 'dot+conv GFLOP (loops x trips)', '{:.2f}'),
    ('xla_gflops', 'cost_analysis GFLOP', '{:.2f}'),
    ('xla_gbytes', 'cost_analysis GB accessed', '{:.2f}'),
)


# Reading StableHLO text

_OP = re.compile(
    r'^\s*(?:%[\w#:, %]+=\s*)?"?((?:stablehlo|chlo|mhlo|sdy|func)\.[a-z_0-9]+'
    r'|call)\b')
_NAME = r'@("[^"]+"|[\w.$-]+)'  # A function's name, quoted if need be.
_CALL = re.compile(r'\bcall ' + _NAME + r'\(')
_FUNC = re.compile(r'^\s*func\.func\s+(?:public\s+|private\s+)?' + _NAME + r'\(')
_CONST = re.compile(
    r'^\s*(%[\w#]+)\s*=\s*stablehlo\.constant\s+dense<(-?\d+)>\s*:\s*'
    r'tensor<i(?:32|64)>')
_COMPARE = re.compile(
    r'stablehlo\.compare\s+LT,\s*(%[\w#]+),\s*(%[\w#]+)')
_TENSOR = re.compile(r'tensor<([^>]*)>')


def _strip_loc(line):
    index = line.find(' loc(')
    return line[:index] if index >= 0 else line


def _shape(tensor):
    """The dims of a `tensor<2x3xbf16>` body ('2x3xbf16')."""
    parts = tensor.split('x')
    return [int(p) for p in parts[:-1] if p.isdigit()]


def _ints(text):
    return [int(x) for x in re.findall(r'-?\d+', text)]


class _Function:

    def __init__(self):
        self.ops = collections.Counter()
        self.dots = collections.Counter()
        self.convs = collections.Counter()
        self.calls = []  # (callee, multiplier)
        self.flops = 0.0  # dot and conv flops, loop bodies times trips
        self.trips = []
        self.defs = {}  # SSA value -> what made it
        self.users = collections.defaultdict(set)  # SSA value -> its users
        self.dot_refs = []  # (signature, lhs, rhs, result) per dot

    def dot_contexts(self):
        """A dot with the ops that make its operands and use its result:
        the elementwise ops XLA may fuse into it, so two dots of one
        signature in different surroundings are separate fusions (an
        approximation: XLA decides what fuses)."""
        return collections.Counter(
            (signature, self.defs.get(lhs, 'arg'), self.defs.get(rhs, 'arg'),
             tuple(sorted(self.users.get(result, ()))))
            for signature, lhs, rhs, result in self.dot_refs)


def _dot_flops(signature):
    lhs_dims = re.search(r'contracting_dims\s*=\s*\[([^\]]*)\]', signature)
    tensors = _TENSOR.findall(signature)
    if not lhs_dims or len(tensors) < 3:
        return 0.0
    lhs, out = _shape(tensors[0]), _shape(tensors[-1])
    contracted = math.prod(lhs[d] for d in _ints(lhs_dims.group(1)))
    return 2.0 * math.prod(out) * contracted


def _conv_flops(signature):
    numbers = re.search(r'x\[([^\]]*)\]->', signature)
    tensors = _TENSOR.findall(signature)
    if not numbers or len(tensors) < 3:
        return 0.0
    kernel, out = _shape(tensors[1]), _shape(tensors[-1])
    layout = [x.strip() for x in numbers.group(1).split(',')]
    outputs = kernel[layout.index('o')] if 'o' in layout else 1
    return 2.0 * math.prod(out) * math.prod(kernel) / max(1, outputs)


def _value(name):
    """The SSA value a use names (`%5#1` is a result of the op `%5`)."""
    return name.split('#')[0]


def _results(line):
    match = re.match(r'^\s*(%[\w]+)(?::\d+)?\s*=', line)
    return [match.group(1)] if match else [None]


def _record_dataflow(fn, name, line):
    what = name
    if name == 'convert':
        types = _TENSOR.findall(line)
        if len(types) >= 2:
            what = (f"convert {types[0].split('x')[-1]}->"
                    f"{types[-1].split('x')[-1]}")
    result = _results(line)[0]
    if result:
        fn.defs[result] = what
    right = line.split('=', 1)[1] if result else line
    for used in set(re.findall(r'%[\w]+', right.split(' : ')[0])):
        fn.users[used].add(what)


def _parse(text):
    """{function name: _Function} of a StableHLO module's text."""
    functions = {}
    current = None
    consts = {}
    loops = []  # [indent, trip count] of the enclosing while ops
    for raw in text.splitlines():
        line = _strip_loc(raw)
        match = _FUNC.match(line)
        if match:
            current = functions.setdefault(match.group(1), _Function())
            consts, loops = {}, []
            continue
        if current is None:
            continue
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if loops and stripped.startswith('}') and indent == loops[-1][0] \
                and 'do {' not in stripped:
            loops.pop()
            continue
        match = _CONST.match(line)
        if match:
            consts[match.group(1)] = int(match.group(2))
        match = _COMPARE.search(line)
        if match and loops and loops[-1][1] is None:
            bound = consts.get(match.group(2))
            loops[-1][1] = bound
            current.trips.append(bound if bound is not None else '?')
        match = _OP.match(line)
        if not match:
            continue
        op = match.group(1)
        multiplier = math.prod(t or 1 for _, t in loops)
        if op in ('func.call', 'call'):
            _record_dataflow(current, 'call', line)
            callee = _CALL.search(line)
            if callee:
                current.calls.append((callee.group(1), multiplier))
            continue
        name = op.split('.', 1)[1]
        current.ops[name] += 1
        _record_dataflow(current, name, line)
        if name == 'dot_general':
            operands = re.search(
                r'dot_general\s+(%[\w#]+),\s*(%[\w#]+)', line)
            signature = line[operands.end():].lstrip(', ').strip()
            current.dots[signature] += 1
            current.dot_refs.append((
                signature, _value(operands.group(1)),
                _value(operands.group(2)), _results(line)[0]))
            current.flops += multiplier * _dot_flops(signature)
        elif name == 'convolution':
            signature = re.sub(r'^.*?convolution\([^)]*\)\s*', '', line).strip()
            current.convs[signature] += 1
            current.flops += multiplier * _conv_flops(signature)
        elif name == 'while':
            loops.append([indent, None])
    return functions


def program_stats(text):
    """Counts of one program's StableHLO text (see the module docstring),
    with every called function inlined as often as it is called."""
    functions = _parse(text)
    main = 'main' if 'main' in functions else next(iter(functions))
    memo = {}

    def expand(name, stack=()):
        if name in memo:
            return memo[name]
        fn = functions.get(name)
        if fn is None or name in stack:
            return (collections.Counter(), collections.Counter(),
                    collections.Counter(), collections.Counter(), 0.0, [])
        ops, dots, convs = fn.ops.copy(), fn.dots.copy(), fn.convs.copy()
        contexts = fn.dot_contexts()
        flops, trips = fn.flops, list(fn.trips)
        for callee, multiplier in fn.calls:
            cops, cdots, cconvs, ccontexts, cflops, ctrips = expand(
                callee, (*stack, name))
            ops.update(cops)
            dots.update(cdots)
            convs.update(cconvs)
            contexts.update(ccontexts)
            flops += multiplier * cflops
            trips += ctrips
        memo[name] = (ops, dots, convs, contexts, flops, trips)
        return memo[name]

    ops, dots, convs, contexts, flops, trips = expand(main)
    return {
        'ops': sum(ops.values()),
        'dot_general': ops['dot_general'],
        'convolution': ops['convolution'],
        'while': ops['while'],
        'custom_call': ops['custom_call'],
        'dot_signatures': len(dots),
        'conv_signatures': len(convs),
        'dot_max_repeat': max(dots.values(), default=0),
        'dot_contexts': len(contexts),
        'trips': ' '.join(str(t) for t in sorted(
            trips, key=lambda t: (isinstance(t, str), t))) or '–',
        'matmul_gflops': flops / 1e9,
        'op_counts': dict(ops.most_common()),
        'dot_list': dict(dots.most_common()),
        'conv_list': dict(convs.most_common()),
        'context_list': [
            [*key, count] for key, count in contexts.most_common()],
    }


# Building the agent and exporting its programs (runs in a subprocess)

def export_programs(flags, texts=''):
    """Builds the agent from command-line `flags` on the CPU and returns
    {program: stats} for its train and report functions lowered for cuda;
    with `texts`, writes their StableHLO to `<texts>/<program>.mlir`."""
    import jax
    import numpy as np
    from embodied import main as mainlib
    config = mainlib.parse(flags)
    agent = mainlib.make_agent(config)
    B = int(config.batch_size)
    context = int(config.replay_context)
    lengths = {
        'train': int(config.batch_length) + context,
        'report': int(config.report_length or config.batch_length) + context}
    spec = lambda tree: jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)
    seed = jax.ShapeDtypeStruct((2,), np.uint32)
    results = {}
    for name in PROGRAMS:
        init = getattr(agent, f'init_{name}')
        jitted = getattr(agent, f'_jit_{name}')
        args = (
            spec(agent._state), spec(init(B)),
            spec(agent._zero_batch(B, lengths[name])), seed)
        # What `jax.export.export(jitted, platforms=['cuda'])` lowers, with
        # XLA's cost analysis at hand.
        lowered = jitted.trace(*args).lower(lowering_platforms=('cuda',))
        text = lowered.as_text()
        if texts:
            pathlib.Path(texts).mkdir(parents=True, exist_ok=True)
            (pathlib.Path(texts) / f'{name}.mlir').write_text(text)
        stats = program_stats(text)
        cost = lowered.cost_analysis() or {}
        if isinstance(cost, list):
            cost = cost[0] if cost else {}
        stats['xla_gflops'] = float(cost.get('flops', float('nan'))) / 1e9
        stats['xla_gbytes'] = float(
            cost.get('bytes accessed', float('nan'))) / 1e9
        stats['batch'] = [B, lengths[name]]
        results[name] = stats
    return results


def _worker(payload):
    flags, texts = json.loads(payload)
    results = export_programs(flags, texts)
    print('RESULT ' + json.dumps(results), flush=True)


# The command

def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--configs', nargs='+', default=['atari', 'size12m'])
    parser.add_argument('--setups', default='',
                        help='comma-separated subset of the setups')
    parser.add_argument('--markdown', default='',
                        help='also write the tables to this file')
    parser.add_argument('--details', default='',
                        help='also write every count and signature (JSON)')
    parser.add_argument('--texts', default='',
                        help='also write each StableHLO program to '
                             '<texts>/<setup>/<program>.mlir')
    parser.add_argument('--worker', default='', help=argparse.SUPPRESS)
    args, extra = parser.parse_known_args(argv)
    if args.worker:
        return _worker(args.worker)
    flags = [
        '--configs', *args.configs, '--jax.platform', 'cpu',
        '--jax.compute_dtype', 'bfloat16', '--jax.precompile', 'False',
        '--jax.debug', 'False', '--jax.prealloc', 'False',
        *[x for x in extra if x != '--']]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        setups, skipped = make_setups(pathlib.Path(tmp))
        if args.setups:
            wanted = args.setups.split(',')
            setups = {k: v for k, v in setups.items() if k in wanted}
        for name, reason in skipped.items():
            print(f'Skipping {name}: {reason}', flush=True)
        for name, (paths, agent_flags) in setups.items():
            print(f'Exporting {name} ...', flush=True)
            texts = str(pathlib.Path(args.texts, name).resolve()) if (
                args.texts) else ''
            results[name] = measure(
                paths, [*agent_flags, *flags], tmp, texts)
    table = render(results, args.configs)
    print(table)
    if args.markdown:
        pathlib.Path(args.markdown).write_text(table + '\n')
    if args.details:
        pathlib.Path(args.details).write_text(json.dumps(results, indent=1))
    return results


def make_setups(tmp):
    """{name: (PYTHONPATH entries, agent flags)} and {name: reason} for
    those that cannot run here."""
    setups = {'ours': ([str(ROOT)], ['--agent_impl', 'dreamerv3'])}
    skipped = {}
    checkout = original.original_checkout()
    if checkout:
        original.copy_agent(checkout, tmp / 'origagent')
        setups['ours+orig agent'] = (
            [str(ROOT), str(tmp / 'origagent')],
            ['--agent_impl', 'dreamerv3.agent:Agent'])
    else:
        skipped['ours+orig agent'] = f'${original.ORIGINAL_ENV} is not set'
    return setups, skipped


def measure(paths, flags, scratch, texts=''):
    work = tempfile.mkdtemp(dir=scratch)
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(paths), JAX_PLATFORMS='cpu',
        EMBODIED_JAX_CACHE='off', TMPDIR=work)
    flags = [*flags, '--logdir', str(pathlib.Path(work) / 'logdir')]
    result = subprocess.run(
        [sys.executable, '-m', 'devtools.compile_size', '--worker',
         json.dumps([flags, texts])],
        cwd=paths[0], env=env, capture_output=True, text=True, timeout=3600)
    lines = [x for x in result.stdout.splitlines() if x.startswith('RESULT ')]
    if result.returncode or not lines:
        raise RuntimeError(
            f'exit {result.returncode}:\n{result.stderr[-3000:]}')
    return json.loads(lines[-1][len('RESULT '):])


def render(results, configs):
    """One markdown table per program, a row per setup."""
    if not results:
        return 'No setup could be measured.'
    lines = []
    for program in PROGRAMS:
        batch = next(iter(results.values()))[program]['batch']
        lines += [
            f'{program} program, cuda lowering, compute dtype bfloat16, '
            f'--configs {" ".join(configs)}, batch {batch[0]}x{batch[1]}:',
            '',
            '| setup | ' + ' | '.join(t for _, t, _ in COLUMNS) + ' |',
            '|---' * (len(COLUMNS) + 1) + '|']
        for name, programs in results.items():
            stats = programs[program]
            cells = [fmt.format(stats[key]) for key, _, fmt in COLUMNS]
            lines.append(f'| {name} | ' + ' | '.join(cells) + ' |')
        lines.append('')
    return '\n'.join(lines).rstrip()


if __name__ == '__main__':
    main()
