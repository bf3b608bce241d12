"""DreamerV3 agent speed: train steps/s, policy latency, compile time and
peak memory of agent bases and agent codes, side by side.

    python -m embodied.perf.agent_speed --configs debug
    EMBODIED_ORIGINAL_DREAMERV3=/path/to/dreamerv3 \\
        python -m embodied.perf.agent_speed --configs atari size12m --rounds 3

Setups, each measured in a fresh subprocess, alternating setups within each
of `--rounds` rounds so that other load on the machine hits all alike:

- `ours`: this package's base (`embodied.jax.Agent`) with our DreamerV3.
- `ours+orig agent`: this base with the original's `dreamerv3/agent.py` and
  `rssm.py`, unchanged (needs the checkout in $EMBODIED_ORIGINAL_DREAMERV3).
- `original`: the original's own base and agent code (its `embodied` package
  from the checkout's work tree; needs its dependencies, e.g. `portal`,
  `chex`, `einops`, and a JAX old enough for its positional `jax.jit`
  calls; the reason is printed when it cannot run).
- `--old REV`: also this base at git revision REV with our DreamerV3.

Each measurement builds the agent at `--configs` (with `--jax.debug False`,
so XLA optimizes as in a real run), then: `build s` is the constructor (the
base initialises the parameters there), `first train s` the first update
including its compile, waited for; `train steps/s` is `--train_steps`
updates after two warm-up updates, fed by the agent's own `stream()` over
one fixed batch and waited for at the end; `policy ms` the p50/p95 latency
of `--policy_calls` policy calls on `--policy_batch` observations after the
first (compiling) call, whose time is `policy compile s`. `peak mem` is the
device's peak bytes in use where the device reports it (GPU), else the
process's peak resident memory (CPU); `cache MiB` what its compiles left in
the persistent compilation cache (fresh for every measurement). With
`--report_calls N`, `report compile s` is the report program's compile,
timed once more with JAX's caches off, and `reports/s` the rate of N
reports on one fixed batch (both for bases that compile `_jit_report`). A setup
that cannot run here is reported with the reason and skipped.

Variants. `--variant 'NAME:FLAGS'` adds our agent with FLAGS as a setup
named NAME, measured in the same alternating rounds, e.g. the open-loop
videos of the report off beside on:

    python -m embodied.perf.agent_speed --configs size1m --task dummy_disc \
        --variant 'no openloop:--agent.report_openloop False'

Layouts. `--jax.train_mesh 8,1,1 1,8,1` measures our agent at each train
mesh (`--jax.policy_mesh` sets the policy's), e.g. on 8 GPUs, or with
`--jax.mock_devices 8` on CPU. Per device: `state MiB/device` is the largest
share of the agent's state (parameters and optimizer moments) one device
holds, `update peak MiB/device` XLA's estimate of one update's peak on a
device (arguments, outputs and temporaries), `device peak MiB` the device's
own peak where it reports one (GPU). On CPU mock devices all devices share
the same cores and memory: the figures show the layout is right (FSDP cuts
the state per device by f), not how fast or large a real run would be.
"""

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile

from embodied.core import tether
from embodied.perf import checkout

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent

# Runs in the measured tree (PYTHONPATH points at it). It uses only what every
# base has: the original's and ours, old and new.
WORKER = r'''
import json, resource, sys, tempfile, time
import numpy as np

(setup, flags, train_steps, policy_calls, policy_batch,
 report_calls) = json.loads(sys.argv[1])
logdir = tempfile.mkdtemp()
start = time.perf_counter()
if setup == 'original':
    import elements, ruamel.yaml as yaml
    from dreamerv3 import main as origmain
    folder = elements.Path(origmain.__file__).parent
    configs = yaml.YAML(typ='safe').load((folder / 'configs.yaml').read())
    parsed, other = elements.Flags(configs=['defaults']).parse_known(flags)
    config = elements.Config(configs['defaults'])
    for name in parsed.configs:
        config = config.update(configs[name])
    config = elements.Flags(config).parse(other).update(logdir=logdir)
    agent = origmain.make_agent(config)
else:
    from embodied import main as mainlib
    config = mainlib.parse(['--logdir', logdir, *flags])
    agent = mainlib.make_agent(config)
# A base that compiles train and report in the background: build counts
# them too, as it does for a base that compiles them before returning.
if hasattr(agent, 'wait_compiled'):
    agent.wait_compiled(report=True)
build = time.perf_counter() - start

import jax
rng = np.random.default_rng(0)

def sample(space, shape):
    if space.discrete:
        return rng.integers(space.low, space.high, shape + space.shape).astype(
            space.dtype)
    return rng.normal(size=shape + space.shape).astype(space.dtype)

def make_batch(B, T):
    batch = {k: sample(v, (B, T)) for k, v in agent.spaces.items()}
    for key in ('is_first', 'is_last', 'is_terminal'):
        batch[key] = np.zeros((B, T), bool)
    if 'consec' in batch:
        batch['consec'] = np.zeros((B, T), np.int32)
    return batch

B, T = config.batch_size, config.batch_length + config.replay_context
batch = make_batch(B, T)

def batches():
    while True:
        yield dict(batch)

stream = iter(agent.stream(batches()))
carry = agent.init_train(B)
start = time.perf_counter()
carry, _, _ = agent.train(carry, next(stream))
jax.block_until_ready(carry)
first_train = time.perf_counter() - start
for _ in range(2):
    carry, _, _ = agent.train(carry, next(stream))
jax.block_until_ready(carry)
start = time.perf_counter()
for _ in range(train_steps):
    carry, _, _ = agent.train(carry, next(stream))
jax.block_until_ready(carry)
train_rate = train_steps / (time.perf_counter() - start)
carry_train = carry

# The report (bases that compile it as `_jit_report`): its compile time,
# compiled once more here with JAX's caches off (the background compile
# filled them), and its calls per second on one fixed batch.
report_compile = report_rate = float('nan')
if hasattr(agent, '_jit_report') and report_calls:
    report_batch = make_batch(B, config.report_length + config.replay_context)
    carry = agent.init_report(B)
    data = agent._prepare_batch(dict(report_batch), 'report')
    jax.config.update('jax_enable_compilation_cache', False)
    jax.clear_caches()  # Else the compile of the first report is reused.
    start = time.perf_counter()
    agent._jit_report.lower(
        agent._state, carry, data, np.zeros(2, np.uint32)).compile()
    report_compile = time.perf_counter() - start
    jax.config.update('jax_enable_compilation_cache', True)
    for _ in range(2):
        carry, _ = agent.report(carry, dict(report_batch))
    start = time.perf_counter()
    for _ in range(report_calls):
        carry, _ = agent.report(carry, dict(report_batch))
    report_rate = report_calls / (time.perf_counter() - start)

obs = {k: sample(v, (policy_batch,)) for k, v in agent.obs_space.items()}
obs['is_first'] = np.zeros(policy_batch, bool)
carry = agent.init_policy(policy_batch)
start = time.perf_counter()
carry, _, _ = agent.policy(carry, obs)
policy_compile = time.perf_counter() - start
for _ in range(3):
    carry, _, _ = agent.policy(carry, obs)
latencies = []
for _ in range(policy_calls):
    start = time.perf_counter()
    carry, act, _ = agent.policy(carry, obs)
    latencies.append(time.perf_counter() - start)

# Per device: the bytes of the agent's state (parameters, optimizer) each
# device holds, and XLA's estimate of one update's peak (arguments, outputs,
# temporaries), the largest over devices; `nan` for bases without them.
state_bytes, step_bytes = {}, float('nan')
for value in getattr(agent, '_state', {}).values():
    for shard in getattr(value, 'addressable_shards', []):
        state_bytes[shard.device] = state_bytes.get(shard.device, 0) + (
            shard.data.nbytes)
if hasattr(agent, '_jit_train'):
    analysis = agent._jit_train.lower(
        agent._state, carry_train, dict(next(stream)),
        np.zeros(2, np.uint32)).compile().memory_analysis()
    if analysis is not None:
        step_bytes = (
            analysis.argument_size_in_bytes + analysis.output_size_in_bytes
            - analysis.alias_size_in_bytes + analysis.temp_size_in_bytes)
devices_used = [d for d in jax.devices() if d in state_bytes] or (
    jax.local_devices()[:1])
device_peaks = [
    (d.memory_stats() or {}).get('peak_bytes_in_use') for d in devices_used]
stats = jax.local_devices()[0].memory_stats() or {}
if 'peak_bytes_in_use' in stats:
    peak, peak_kind = stats['peak_bytes_in_use'], 'device'
else:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    peak_kind = 'process RSS'
print('RESULT ' + json.dumps(dict(
    build=build, first_train=first_train, train_rate=train_rate,
    report_compile=report_compile, report_rate=report_rate,
    policy_compile=policy_compile,
    policy_p50_ms=1000 * float(np.percentile(latencies, 50)),
    policy_p95_ms=1000 * float(np.percentile(latencies, 95)),
    peak_gb=peak / 2 ** 30, peak_kind=peak_kind,
    devices=len(devices_used),
    state_mb=max(state_bytes.values(), default=float('nan')) / 2 ** 20,
    step_mb=step_bytes / 2 ** 20,
    device_peak_mb=max(
        [p for p in device_peaks if p] or [float('nan')]) / 2 ** 20,
    device=str(jax.local_devices()[0].device_kind), batch=[B, T],
    policy_batch=policy_batch)))
'''

COLUMNS = (
    ('train_rate', 'train steps/s', '{:.2f}'),
    ('policy_p50_ms', 'policy p50 ms', '{:.2f}'),
    ('policy_p95_ms', 'policy p95 ms', '{:.2f}'),
    ('build', 'build s', '{:.1f}'),
    ('first_train', 'first train s', '{:.1f}'),
    ('report_compile', 'report compile s', '{:.1f}'),
    ('report_rate', 'reports/s', '{:.2f}'),
    ('policy_compile', 'policy compile s', '{:.1f}'),
    ('peak_gb', 'peak mem GiB', '{:.2f}'),
    ('devices', 'train devices', '{:.0f}'),
    ('state_mb', 'state MiB/device', '{:.3f}'),
    ('step_mb', 'update peak MiB/device', '{:.3f}'),
    ('device_peak_mb', 'device peak MiB', '{:.1f}'),
    ('cache_mb', 'cache MiB', '{:.1f}'),
)


def main(argv=None):
    args, extra = parse_args(argv)
    platform = args.platform or (
        'cuda' if shutil.which('nvidia-smi') else 'cpu')
    flags = [
        '--configs', *args.configs, '--jax.debug', 'False',
        '--jax.platform', platform, *[x for x in extra if x != '--']]
    if args.policy_mesh:
        flags += ['--jax.policy_mesh', args.policy_mesh]
    with tempfile.TemporaryDirectory() as tmp:
        setups, skipped = make_setups(args, pathlib.Path(tmp), platform)
        if args.setups:
            wanted = args.setups.split(',')
            setups = {k: v for k, v in setups.items() if k in wanted}
        for name, reason in skipped.items():
            print(f'Skipping {name}: {reason}', flush=True)
        results = {name: [] for name in setups}
        for index in range(args.rounds):
            for name, setup in setups.items():
                try:
                    result = measure(setup, flags, args, tmp)
                except RuntimeError as e:
                    print(f'{name} failed:\n{e}', flush=True)
                    continue
                results[name].append(result)
                print(f'round {index + 1}/{args.rounds} {name}: '
                      f'{result["train_rate"]:.2f} train steps/s, policy '
                      f'{result["policy_p50_ms"]:.2f} ms, first train '
                      f'{result["first_train"]:.1f} s', flush=True)
    results = {k: v for k, v in results.items() if v}
    table = render(results, flags, args.rounds)
    print(table)
    if args.markdown:
        pathlib.Path(args.markdown).write_text(table + '\n')


def parse_args(argv):
    """The tool's own options and the flags it passes on to every setup."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--configs', nargs='+', default=['debug'])
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--train_steps', type=int, default=50)
    parser.add_argument('--policy_calls', type=int, default=200)
    parser.add_argument('--policy_batch', type=int, default=16)
    parser.add_argument('--report_calls', type=int, default=0,
                        help='also measure the report: its compile time and '
                             'the rate of this many calls (0: not measured)')
    parser.add_argument(
        '--variant', action='append', default=[], metavar='NAME:FLAGS',
        help="also measure ours with these flags added, as a setup named "
             "NAME, e.g. 'no openloop:--agent.report_openloop False'; "
             "repeatable")
    parser.add_argument('--platform', default='',
                        help="jax.platform for every setup (default: 'cuda' "
                             "where nvidia-smi exists, else 'cpu')")
    parser.add_argument('--old', default='',
                        help='also measure this base at this git revision')
    parser.add_argument('--setups', default='',
                        help='comma-separated subset of the setups to run')
    parser.add_argument(
        '--jax.train_mesh', dest='train_mesh', nargs='+', default=[],
        help="measure ours at each of these train meshes ('d,f,t'), e.g. "
             "8,1,1 1,8,1 (with --jax.mock_devices 8 on CPU)")
    parser.add_argument(
        '--jax.policy_mesh', dest='policy_mesh', default='',
        help='the policy mesh for every setup')
    parser.add_argument('--markdown', default='',
                        help='also write the table to this file')
    return parser.parse_known_args(argv)


def make_setups(args, tmp, platform):
    """{name: (PYTHONPATH entries, setup kind, agent flags)} and {name:
    reason} for those that cannot run here."""
    ours = ['--agent_impl', 'dreamerv3']
    setups = {'ours': ([str(ROOT)], 'ours', ours)}
    skipped = {}
    source = checkout.original_checkout()
    if not source:
        reason = f'${checkout.ORIGINAL_ENV} is not set'
        skipped['ours+orig agent'] = skipped['original'] = reason
    else:
        checkout.copy_agent(source, tmp / 'origagent')
        setups['ours+orig agent'] = (
            [str(ROOT), str(tmp / 'origagent')], 'ours',
            ['--agent_impl', 'dreamerv3.agent:Agent'])
        problem = original_base_problem(source)
        if problem:
            skipped['original'] = problem
        else:
            setups['original'] = ([source], 'original', [])
    if args.old:
        old = checkout.trees(args.old, tmp)[args.old]
        setups[f'ours@{args.old}'] = ([str(old)], 'ours', ours)
    for variant in getattr(args, 'variant', ()):
        name, sep, flags = variant.partition(':')
        if not sep or not name.strip():
            raise SystemExit(
                f"--variant {variant!r}: expected NAME:FLAGS, e.g. "
                f"'no openloop:--agent.report_openloop False'.")
        setups[name.strip()] = ([str(ROOT)], 'ours', [*ours, *flags.split()])
    if args.train_mesh:
        setups.pop('ours')
        setups = {
            **{f'ours {mesh}': (
                [str(ROOT)], 'ours', [*ours, '--jax.train_mesh', mesh])
               for mesh in args.train_mesh}, **setups}
    return setups, skipped


def original_base_problem(source):
    """Why the original's own base cannot run here, or ''."""
    if not checkout.is_worktree(source):
        return f'{source} is not a work tree (its embodied package is needed)'
    env = dict(os.environ, PYTHONPATH=source)
    result = subprocess.run(
        [sys.executable, '-c', ORIGINAL_CHECK], cwd=source, env=env,
        capture_output=True, text=True)
    if result.returncode:
        return ('its embodied package does not import: ' +
                result.stderr.strip().splitlines()[-1])
    return result.stdout.strip()


# The original's base passes jax.jit its shardings positionally
# (embodied/jax/transform.py), which newer JAX versions refuse.
ORIGINAL_CHECK = r'''
import inspect
import embodied, embodied.jax, dreamerv3.main
import jax
kinds = (inspect.Parameter.POSITIONAL_ONLY,
         inspect.Parameter.POSITIONAL_OR_KEYWORD)
params = inspect.signature(jax.jit).parameters.values()
if sum(p.kind in kinds for p in params) < 5:
    print(f'its base calls jax.jit(fun, in_shardings, out_shardings, ...) '
          f'positionally, which jax {jax.__version__} (installed) refuses; '
          f'it needs an older jax')
'''


def measure(setup, flags, args, scratch, cache=None):
    """One setup's figures, measured in a fresh subprocess. It compiles from
    scratch into a new persistent cache (kept in the folder `cache` when
    given, e.g. for a run to start from afterwards)."""
    paths, kind, agent_flags = setup
    # The setup's trees first; the caller's PYTHONPATH (e.g. where wheels
    # were unpacked) after them.
    inherited = os.environ.get('PYTHONPATH', '')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [*paths, *([inherited] if inherited else [])]))
    tmp = pathlib.Path(tempfile.mkdtemp(dir=scratch))
    cache = pathlib.Path(cache) if cache else tmp / 'cache'
    env['EMBODIED_JAX_CACHE'] = str(cache)
    env['TMPDIR'] = str(tmp)  # The worker's logdir.
    if '--jax.platform' in flags and flags[flags.index('--jax.platform') + 1] == 'cpu':
        env['JAX_PLATFORMS'] = 'cpu'
    payload = json.dumps([
        kind, [*agent_flags, *flags], args.train_steps, args.policy_calls,
        args.policy_batch, getattr(args, 'report_calls', 0)])
    result = tether.run(  # Killed, this command takes the worker along.
        ['-c', WORKER, payload], cwd=paths[0], env=env,
        capture_output=True, text=True, timeout=3600)
    lines = [x for x in result.stdout.splitlines() if x.startswith('RESULT ')]
    if result.returncode or not lines:
        raise RuntimeError(
            f'exit {result.returncode}:\n{result.stderr[-3000:]}')
    measured = json.loads(lines[-1][len('RESULT '):])
    files = [f for f in cache.rglob('*') if f.is_file()]
    measured['cache_mb'] = sum(f.stat().st_size for f in files) / 2 ** 20
    shutil.rmtree(tmp, ignore_errors=True)
    return measured


def render(results, flags, rounds):
    """Per setup, the median over rounds of each measure and the best train
    steps/s (the round least disturbed by other load); train steps/s and
    policy latency also relative to the first setup, as the median of the
    per-round ratios (each round measures all setups back to back)."""
    if not results:
        return 'No setup could be measured.'
    names = list(results)
    first = results[names[0]][0]
    columns = [
        (key, title, fmt) for key, title, fmt in COLUMNS
        if not key.startswith('report_') or any(
            r[key] == r[key] for rows in results.values() for r in rows)]
    lines = [
        f'DreamerV3 agent speed on {first["device"]}, flags: '
        f'{" ".join(flags)}; train batch {first["batch"][0]}x'
        f'{first["batch"][1]}, policy batch {first["policy_batch"]}; '
        f'medians of {rounds} alternating rounds; peak mem is '
        f'{first["peak_kind"]}',
        '',
        '| setup | ' + ' | '.join(title for _, title, _ in columns) +
        ' | best steps/s | steps/s vs first | policy p50 vs first |',
        '|---' * (len(columns) + 4) + '|']
    base = results[names[0]]
    for name in names:
        rows = results[name]
        cells = [fmt.format(statistics.median(r[key] for r in rows))
                 for key, _, fmt in columns]
        ratio = lambda key: statistics.median(
            n[key] / o[key] for o, n in zip(base, rows))
        cells.append(f'{max(r["train_rate"] for r in rows):.2f}')
        cells.append(f'{ratio("train_rate"):.2f}x')
        cells.append(f'{ratio("policy_p50_ms"):.2f}x')
        lines.append(f'| {name} | ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


if __name__ == '__main__':
    main()
