"""One command for a GPU machine: a cold parallel launch, a relaunch, the
runner in both modes of `run.policy_worker`, the agent's own speed (also
with each XLA setting flipped), a cold launch at the default model size,
and a policy probe in a second process, in one table; then the GPU
targets of a policy process against the measurements.

    python -m embodied.perf.gpu_check                # on a GPU: see below
    EMBODIED_ORIGINAL_DREAMERV3=/path/to/dreamerv3 \\
        python -m embodied.perf.gpu_check            # plus the original's code
    python -m embodied.perf.gpu_check --quick        # `debug`, on CPU (CI)

Steps, each in fresh processes:

1. `--script parallel` at `--configs` (default `atari size12m`) with
   `--envs` envs and no eval envs for `--seconds`, on an empty compilation
   cache, as a user's first launch meets it: seconds from launch to the
   first env step and to the first finished train step, the agent's
   compile seconds, env steps/s (whole run and steady), train steps/s and
   the learner's rate as % of step 3's standalone rate, the policy batch
   ms inside the runner (first request of a batch to its reply), and how
   busy the GPU was over the steady window (`nvidia-smi`'s utilization,
   polled; '–' without it).
2. The same command again on the same logdir (a resume) for
   `--relaunch_seconds`, on the now warm cache: the agent's compile
   seconds, how many programs it compiled anew (0: the cache served all)
   and the first env step.
3. Two more resumes of that logdir on the warm cache, for
   `--mode_seconds` each: `--run.policy_worker thread` (the policy in the
   agent's process) and `--run.policy_worker process` (the policy in a
   process of its own), with step 1's figures. A runner without the key
   `run.policy_worker` gets a row that says so; a mode that fails gets a
   row with its last line, and the check goes on.
4. `agent_speed` of our DreamerV3 at `--configs` on the warm cache: train
   steps/s alone, policy p50 at batch 16; with $EMBODIED_ORIGINAL_DREAMERV3
   set, the same for the original's agent code on our base. On a GPU
   (unless `--no-xla_settings`), once more with each of the original's
   XLA settings flipped, `--jax.deterministic False` and `--jax.autotune
   4` (XLA's defaults): its programs compile anew, so `build` is that
   setting's compile and train steps/s its cost in the train step.
5. `--script parallel` at `--default_configs` (default `atari gpu`, the
   default model size) on an empty cache of its own, ended after
   `--default_seconds` (150) or once it compiled: compile seconds and the
   first env step.
6. A policy probe: policy p50 and p95 at batch 16 in a second process on
   the same device, alone and while a first process runs train steps back
   to back (each process gets `--memory_fraction` of the GPU's memory), and
   that train rate beside step 3's standalone one.

On an H100 or H200 the steps are sized to about 11 minutes in all: 2
minutes of run plus its start and cold compile, a 30-s relaunch, two 75-s
mode runs, 50 train steps and 200 policy calls on the warm cache (and
twice 50 train steps after a compile with a setting flipped, about 2
minutes), at most 150 s at the default size, and a probe of 200 policy
calls alone and 200 beside training.

After the table, the targets of a policy process (issue 55: one H100 or
H200, atari size12m, 16 envs) against the two mode rows: the learner at
least 85% of standalone, the policy batch at most 2x the policy alone
(the runner's mean policy batch, first request to reply, against step 4's
p50 at batch 16), the GPU busy at least 90%, env steps/s (steady) at
least 1.3x the thread mode's.

`--quick` runs the same steps at `debug` on a vector task
(`cartpole_balance`: no CNN to compile on a CPU) with 4 envs and short runs
that stop at an env step count rather than after seconds, so a slow compile
on a busy machine cannot use up the run (the CI test runs it on CPU). Its
"default size" launch is at those same configs, so it starts on the runs'
warm cache instead of an empty one: a second cold compile of the same
programs would show nothing the first did not.
With `--quick` the mode runs are resumes to a step count too.
`--markdown FILE` also writes the table.
"""

import argparse
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import types

from embodied.core import tether
from embodied.perf import agent_speed
from embodied.perf import checkout
from embodied.perf import launch_time
from embodied.perf import throughput

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent

# The task of every step with --quick: agent_speed and the probe then find
# on the warm cache the programs the parallel runs compiled. Vector
# observations: at `debug` on a CPU, a CNN's compile and updates would be
# most of the check's minutes and show nothing the steps do not.
QUICK_TASK = 'cartpole_balance'


def make_parser():
    parser = argparse.ArgumentParser(
        description=' '.join(__doc__.split('\n\n')[0].split()),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument('--quick', action='store_true',
                        help='debug config, a vector task, short runs (CI)')
    parser.add_argument('--configs', nargs='+', default=['atari', 'size12m'],
                        help='config blocks of the parallel runs and of '
                             'agent_speed')
    parser.add_argument('--envs', type=int, default=16,
                        help='train envs of the parallel runs')
    parser.add_argument('--seconds', type=float, default=120,
                        help='length of the cold parallel run, from launch')
    parser.add_argument('--relaunch_seconds', type=float, default=30,
                        help='length of the relaunch')
    parser.add_argument('--mode_seconds', type=float, default=75,
                        help='length of each run.policy_worker mode run')
    parser.add_argument(
        '--xla_settings', action=argparse.BooleanOptionalAction,
        default=True, help="on a GPU, agent_speed with each of jax."
        "deterministic and jax.autotune flipped")
    parser.add_argument('--train_steps', type=int, default=50,
                        help="agent_speed's timed train steps")
    parser.add_argument('--policy_calls', type=int, default=200,
                        help="agent_speed's and the probe's timed policy "
                             'calls')
    parser.add_argument(
        '--default_configs', nargs='+', default=['atari', 'gpu'],
        help='config blocks of the cold launch at the default model size')
    parser.add_argument(
        '--default_seconds', type=float, default=150,
        help='the most that launch runs; it ends once it compiled')
    parser.add_argument(
        '--memory_fraction', type=float, default=0.4,
        help='XLA_PYTHON_CLIENT_MEM_FRACTION of each probe process')
    parser.add_argument(
        '--cache', default='',
        help='keep the compilation cache in this folder (default: a '
             'temporary one); it must not exist yet, so the launch is cold')
    parser.add_argument('--markdown', default='',
                        help='also write the table to this file')
    return parser


def main(argv=None):
    args = make_parser().parse_args(argv)
    if args.quick:
        args.configs = args.default_configs = ['debug']
        args.envs, args.seconds, args.relaunch_seconds = 4, 25, 20
        args.mode_seconds = 20
        args.train_steps, args.policy_calls = 5, 20
        args.default_seconds = 300  # On CPU; it ends once it compiled.
    gpu = shutil.which('nvidia-smi') is not None
    platform = 'cuda' if gpu else 'cpu'
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        cache = pathlib.Path(args.cache) if args.cache else tmp / 'jaxcache'
        if cache.exists() and any(cache.iterdir()):
            sys.exit(f'--cache {cache}: the folder is not empty; the cold '
                     f'launch needs an empty cache.')
        rows, runs, speed = measure_all(args, platform, tmp, cache)
    device = speed['ours']['device'] if 'ours' in speed else platform
    table = render(args, device, rows, time.monotonic() - start)
    table += '\n\n' + targets_table(runs, speed.get('ours', {}))
    for name in ('cold launch', 'relaunch'):
        table += (f'\n\nThe first lines of the {name}:\n\n```\n'
                  + '\n'.join(runs[name]['first_lines']) + '\n```')
    print(table, flush=True)
    if args.markdown:
        pathlib.Path(args.markdown).write_text(table + '\n')


def measure_all(args, platform, tmp, cache):
    """Every step in order: the table's rows, the parallel runs' figures
    by name ('cold launch', 'relaunch', and each mode: figures or why
    not), and agent_speed's figures by setup."""
    logdir = tmp / 'run'
    # --quick: 250 steps leave room for the first updates (at debug the
    # replay's limiter holds the envs back after about 130 steps until
    # the learner trains); each resume goes on to its own step count.
    runs = {'cold launch': run_parallel(
        args, platform, logdir, cache, args.seconds, 250)}
    runs['relaunch'] = run_parallel(
        args, platform, logdir, cache, args.relaunch_seconds, 310)
    for mode, steps in (('thread', 340), ('process', 370)):
        runs[mode] = run_mode(args, platform, logdir, cache, mode, steps)
    speed = agent_speeds(args, platform, tmp, cache)
    standalone = speed.get('ours', {}).get('train_rate')
    again = runs['relaunch']
    rows = [(f'parallel, {args.envs} envs, {args.seconds:g} s, cold cache',
             format_run(runs['cold launch'], standalone)),
            ('relaunch (resume, warm cache)',
             f"compile {again['compile_s']:.1f} s, "
             f"{again['new_programs']} programs compiled anew, "
             f"first env step {again['first_step_s']:.1f} s after launch")]
    rows += [(f'parallel, {args.envs} envs, run.policy_worker {mode}, '
              f'{args.mode_seconds:g} s, warm cache (resume)',
              runs[mode] if isinstance(runs[mode], str)
              else format_run(runs[mode], standalone))
             for mode in MODES]
    rows += [(f'agent_speed: {name} (warm cache)', format_speed(
        result, None if name in ('ours', 'ours+orig agent') else standalone))
             for name, result in speed.items()]
    default = run_default(
        args, platform, tmp, cache if args.quick else tmp / 'default-cache')
    rows.append((
        f"parallel at {' '.join(args.default_configs)}, "
        f"{'warm' if args.quick else 'cold'} cache, "
        f"at most {args.default_seconds:g} s", format_default(
            default, args.default_seconds)))
    probe = policy_probe(args, platform, tmp, cache)
    rows.append(('policy in a second process, batch 16',
                 format_probe(probe, standalone)))
    return rows, runs, speed


MODES = ('thread', 'process')
NO_KEY = 'not run: the runner has no key run.policy_worker'


def knows_policy_worker():
    """Whether this tree's runner has the key `run.policy_worker`."""
    from embodied import config as configlib
    return 'run.policy_worker' in configlib.load_blocks()['defaults']


def run_mode(args, platform, logdir, cache, mode, quick_steps):
    """A resume of `logdir` with `--run.policy_worker mode` for
    `--mode_seconds`: its figures, or a line that says why there are
    none."""
    if not knows_policy_worker():
        print(f'parallel, {mode}: {NO_KEY}', flush=True)
        return NO_KEY
    try:
        return run_parallel(
            args, platform, logdir, cache, args.mode_seconds, quick_steps,
            ('--run.policy_worker', mode))
    except RuntimeError as e:
        last = [x for x in str(e).splitlines() if x.strip()][-1:]
        print(f'parallel, {mode}: failed: {e}', flush=True)
        return f"failed: {' '.join(last) or 'no output'}".replace('|', '/')


def agent_flags(args, platform):
    """The agent of agent_speed and the probe: `--configs` with XLA's
    optimizations on (`--jax.debug False`), as the parallel runs have
    them; with `--quick`, the runs' task and the `debug` block's own
    setting (optimizations off), so these steps too find the runs'
    programs cached."""
    quick = ['--task', QUICK_TASK] if args.quick else [
        '--jax.debug', 'False']
    return ['--configs', *args.configs, '--jax.platform', platform, *quick]


def agent_speeds(args, platform, tmp, cache):
    """{setup: agent_speed figures} for ours (compiled into `cache`) and,
    with the original's checkout at hand, its agent code on our base."""
    options = types.SimpleNamespace(
        train_steps=args.train_steps, policy_calls=args.policy_calls,
        policy_batch=16, old='', train_mesh=[])
    setups, skipped = agent_speed.make_setups(options, tmp, platform)
    for name, reason in skipped.items():
        if name != 'original':
            print(f'agent_speed: skipping {name}: {reason}', flush=True)
    flags = agent_flags(args, platform)
    results = {}
    for name in ('ours', 'ours+orig agent'):
        if name not in setups:
            continue
        print(f'agent_speed: {name} ...', flush=True)
        results[name] = agent_speed.measure(
            setups[name], flags, options, tmp,
            cache=cache if name == 'ours' else None)
        print(f'agent_speed: {name}: {format_speed(results[name])}',
              flush=True)
    if 'ours' in setups and platform == 'cuda' and args.xla_settings:
        for setting in XLA_SETTINGS:
            name = f'ours, --{setting[0]} {setting[1]}'
            print(f'agent_speed: {name} ...', flush=True)
            results[name] = agent_speed.measure(
                setups['ours'], [*flags, *(f'--{setting[0]}', setting[1])],
                options, tmp, cache=cache)
            print(f'agent_speed: {name}: {format_speed(results[name])}',
                  flush=True)
    return results


# The original's XLA settings flipped to XLA's defaults, one at a time.
XLA_SETTINGS = (('jax.deterministic', 'False'), ('jax.autotune', '4'))


def run_parallel(args, platform, logdir, cache, seconds, quick_steps,
                 extra=()):
    """One `--script parallel` run (a resume when `logdir` has a run) for
    `seconds`, or with `--quick` to the run's env step `quick_steps`, with
    the flags `extra`; its summary figures, and the GPU's mean utilization
    over the steady window."""
    flags = ['--configs', *args.configs, '--run.eval_envs', '0',
             '--run.log_every', '10', '--jax.platform', platform, *extra]
    if args.quick:
        flags += ['--task', QUICK_TASK, '--run.duration', '0',
                  '--run.steps', quick_steps]
    env = {'EMBODIED_JAX_CACHE': str(cache),
           # Only the agent's process uses the GPU; the runner's own setting.
           'JAX_PLATFORMS': 'cpu' if platform == 'cpu' else None}
    print(f'parallel: {seconds:g} s at {" ".join(args.configs)}, '
          f'{args.envs} envs {" ".join(extra)}...', flush=True)
    programs = cached_programs(cache)
    with GpuUtilization() as gpu:
        # --quick stops at a step count; `seconds` bounds the wait then.
        output, _, _, lines, _ = throughput.launch(
            ROOT, 'embodied.run.parallel', 900 if args.quick else seconds,
            '--script', 'parallel',
            '--logdir', str(logdir), '--run.envs', args.envs, *flags,
            env=env, common=())
    first_train = re.findall(
        r'First train step finished ([\d.]+) s after launch', output)
    summary = re.findall(r'\[Summary\] (.*)', output)
    if not summary:
        raise RuntimeError(f'no summary line:\n{output[-3000:]}')
    values = {k: float(v) for k, v in (
        item.split('=') for item in summary[-1].split())}
    compiled = re.findall(r'Compiled the agent in ([\d.]+) s', output)
    window = throughput.steady_window(lines)
    values.update(
        steady_fps=throughput.steady_fps(lines),
        compile_s=float(compiled[-1]) if compiled else float('nan'),
        first_train_s=(
            float(first_train[-1]) if first_train else float('nan')),
        gpu_busy=gpu.mean(*(w[0] for w in window)) if window else None)
    values['new_programs'] = cached_programs(cache) - programs
    values['first_lines'] = first_lines(output)
    print(f'parallel: {summary[-1]}', flush=True)
    return values


def cached_programs(cache):
    """How many compiled programs the compilation cache folder holds."""
    return sum(1 for x in pathlib.Path(cache).glob('*-cache'))


FIRST_LINES = ('Launching ', 'Agent:', 'Launcher:', 'Compiled the agent',
               'First env step', 'First train step')


def first_lines(output):
    """A launch's lines about its start, up to its `Compiled the agent`
    line (for the docs' cold start and relaunch)."""
    lines = []
    for line in output.splitlines():
        if line.startswith(FIRST_LINES):
            lines.append(line)
        if line.startswith('Compiled the agent'):
            break
    return lines


class GpuUtilization:
    """Polls `nvidia-smi`'s GPU utilization (% of time a kernel ran) twice a
    second while in use; `mean(t0, t1)` over the polls in that window of
    `time.monotonic()`, or None without nvidia-smi."""

    COMMAND = ('nvidia-smi', '--query-gpu=utilization.gpu',
               '--format=csv,noheader,nounits', '--id=0')

    def __init__(self):
        self.samples = []
        self._stop = threading.Event()
        self._thread = None

    def __enter__(self):
        if shutil.which('nvidia-smi'):
            self._thread = threading.Thread(target=self._poll, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread:
            self._thread.join(5)

    def _poll(self):
        while not self._stop.wait(0.5):
            try:
                out = subprocess.run(
                    self.COMMAND, capture_output=True, text=True, timeout=5)
                self.samples.append((time.monotonic(), float(out.stdout)))
            except (subprocess.SubprocessError, ValueError):
                continue

    def mean(self, t0, t1):
        inside = [value for when, value in self.samples if t0 <= when <= t1]
        return sum(inside) / len(inside) if inside else None


def run_default(args, platform, tmp, cache):
    """A launch at `--default_configs` on the compilation cache `cache`
    (an empty one of its own but with `--quick`), ended once it compiled
    (or after `--default_seconds`): its first env step and compile seconds
    (NaN for what it did not reach)."""
    flags = ['--script', 'parallel', '--configs', *args.default_configs,
             '--jax.platform', platform, '--logdir', str(tmp / 'default'),
             '--run.log_every', '1e9', '--run.save_every', '1e9']
    if args.quick:
        flags += ['--task', QUICK_TASK, '--run.envs', '2',
                  '--run.eval_envs', '0']
    print(f"default size: a launch at {' '.join(args.default_configs)} "
          f"for at most {args.default_seconds:g} s ...", flush=True)
    return launch_time.launch_parallel(
        ROOT, flags, cache, args.default_seconds,
        needed=('first_env', 'compile'), platform=platform)


# A probe process: `train` runs train steps back to back between two marks
# the `policy` process leaves; `policy` times policy calls alone, then
# while the other trains. Files in `folder` coordinate them.
PROBE = r'''
import json, pathlib, sys, tempfile, time
import numpy as np
role, flags, folder, calls, size = json.loads(sys.argv[1])
folder = pathlib.Path(folder)
from embodied import main as mainlib
config = mainlib.parse(['--logdir', tempfile.mkdtemp(), *flags])
agent = mainlib.make_agent(config)
import jax
rng = np.random.default_rng(0)

def sample(space, shape):
    if space.discrete:
        return rng.integers(space.low, space.high, shape + space.shape).astype(
            space.dtype)
    return rng.normal(size=shape + space.shape).astype(space.dtype)

def wait(name):
    deadline = time.monotonic() + 900
    while not (folder / name).exists():
        assert time.monotonic() < deadline, f'no {name} mark'
        time.sleep(0.05)

if role == 'train':
    B, T = config.batch_size, config.batch_length + config.replay_context
    batch = {k: sample(v, (B, T)) for k, v in agent.spaces.items()}
    for key in ('is_first', 'is_last', 'is_terminal'):
        batch[key] = np.zeros((B, T), bool)
    if 'consec' in batch:
        batch['consec'] = np.zeros((B, T), np.int32)
    stream = iter(agent.stream(iter(lambda: dict(batch), None)))
    carry = agent.init_train(B)
    for _ in range(3):
        carry, _, _ = agent.train(carry, next(stream))
    jax.block_until_ready(carry)
    (folder / 'train_ready').touch()
    wait('policy_alone_done')
    start, steps = time.perf_counter(), 0
    while not (folder / 'policy_done').exists():
        carry, _, _ = agent.train(carry, next(stream))
        steps += 1
        if steps % 5 == 0:
            jax.block_until_ready(carry)
    jax.block_until_ready(carry)
    rate = steps / (time.perf_counter() - start)
    print('RESULT ' + json.dumps({'train_rate': rate}), flush=True)
else:
    obs = {k: sample(v, (size,)) for k, v in agent.obs_space.items()}
    obs['is_first'] = np.zeros(size, bool)
    carry = agent.init_policy(size)
    for _ in range(5):
        carry, _, _ = agent.policy(carry, obs)
    wait('train_ready')

    def latencies():
        global carry
        result = []
        for _ in range(calls):
            start = time.perf_counter()
            carry, _, _ = agent.policy(carry, obs)
            result.append(1000 * (time.perf_counter() - start))
        return result

    alone = latencies()
    (folder / 'policy_alone_done').touch()
    time.sleep(1.0)  # The trainer's updates are queued on the device.
    shared = latencies()
    (folder / 'policy_done').touch()
    figures = {}
    for name, values in (('alone', alone), ('shared', shared)):
        figures[f'{name}_p50'] = float(np.percentile(values, 50))
        figures[f'{name}_p95'] = float(np.percentile(values, 95))
    print('RESULT ' + json.dumps(figures), flush=True)
'''


def policy_probe(args, platform, tmp, cache):
    """Policy latency at batch 16 in a second process, alone and while the
    first one trains back to back, and that train rate."""
    folder = tmp / 'probe'
    folder.mkdir()
    flags = ['--agent_impl', 'dreamerv3', *agent_flags(args, platform)]
    env = {**os.environ, 'EMBODIED_JAX_CACHE': str(cache),
           'PYTHONPATH': os.pathsep.join(
               p for p in (str(ROOT), os.environ.get('PYTHONPATH', '')) if p),
           'XLA_PYTHON_CLIENT_MEM_FRACTION': str(args.memory_fraction)}
    if platform == 'cpu':
        env['JAX_PLATFORMS'] = 'cpu'
    print('probe: policy in a second process while the first trains ...',
          flush=True)
    # The policy process compiles no learner of its own meanwhile.
    extra = {'train': [], 'policy': ['--jax.precompile', 'False']}
    procs = {
        role: tether.popen(
            ['-c', PROBE, json.dumps(
                [role, [*flags, *extra[role]], str(folder),
                 args.policy_calls, 16])],
            cwd=str(ROOT), env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        for role in ('train', 'policy')}
    results = {}
    try:
        for role, proc in procs.items():
            output, _ = proc.communicate(timeout=900)
            lines = [x for x in output.splitlines()
                     if x.startswith('RESULT ')]
            if proc.returncode or not lines:
                raise RuntimeError(
                    f'probe {role}: exit {proc.returncode}:\n'
                    f'{output[-3000:]}')
            results.update(json.loads(lines[-1][len('RESULT '):]))
    finally:
        for proc in procs.values():
            tether.end(proc, grace=0)
    print(f'probe: {format_probe(results, None)}', flush=True)
    return results


def format_probe(probe, standalone):
    alone = (f"{100 * probe['train_rate'] / standalone:.0f}% of the "
             f"standalone {standalone:.2f}" if standalone else
             'standalone rate unknown')
    return (f"p50 {probe['shared_p50']:.2f} ms, p95 {probe['shared_p95']:.2f}"
            f" ms while the other process trains at "
            f"{probe['train_rate']:.2f} train steps/s ({alone}); alone p50 "
            f"{probe['alone_p50']:.2f} ms, p95 {probe['alone_p95']:.2f} ms")


def format_default(result, seconds):
    compiled = (f"compile {result['compile']:.1f} s"
                if result['compile'] == result['compile'] else
                f'not compiled within {seconds:g} s')
    first = (f"first env step {result['first_env']:.1f} s after launch"
             if result['first_env'] == result['first_env'] else
             f'no env step within {seconds:g} s')
    return f'{compiled}, {first}'


def format_speed(result, standalone=None):
    """agent_speed's figures; with `standalone`, the train rate also as %
    of it."""
    share = (f" ({100 * result['train_rate'] / standalone:.0f}% of the "
             f"defaults' {standalone:.2f})" if standalone else '')
    return (f"{result['train_rate']:.2f} train steps/s{share}, policy p50 "
            f"{result['policy_p50_ms']:.2f} ms at batch 16, build "
            f"{result['build']:.1f} s + first train "
            f"{result['first_train']:.1f} s + policy compile "
            f"{result['policy_compile']:.1f} s, peak "
            f"{result['peak_gb']:.2f} GiB ({result['peak_kind']})")


def format_run(run, standalone):
    run = {**dict.fromkeys(SUMMARY_KEYS, NAN), **run}
    learner = (f"{100 * run['train_fps'] / standalone:.0f}% of standalone"
               if standalone else 'standalone rate unknown')
    busy = ('–' if run['gpu_busy'] is None else f"{run['gpu_busy']:.0f}%")
    return (f"{run['env_fps']:.0f} env steps/s ({run['steady_fps']:.0f} "
            f"steady), {run['train_fps']:.2f} train steps/s ({learner}), "
            f"policy batch {run['policy_batch_ms']:.1f} ms of "
            f"{run['policy_batch_envs']:.1f} envs, GPU busy {busy}, compile "
            f"{run['compile_s']:.1f} s, first env step "
            f"{run['first_step_s']:.1f} s, first train step "
            f"{run['first_train_s']:.1f} s after launch")


NAN = float('nan')
SUMMARY_KEYS = ('env_fps', 'train_fps', 'policy_batch_ms',
                'policy_batch_envs', 'first_step_s')


def target_figures(run, speed):
    """A mode run's figures the targets compare: learner % of standalone,
    policy batch as a multiple of the policy alone, GPU busy %, steady
    env steps/s (NaN for what was not measured)."""
    if not isinstance(run, dict):
        return dict.fromkeys(('learner', 'batch', 'busy', 'fps'), NAN)
    run = {**dict.fromkeys(SUMMARY_KEYS, NAN), **run}
    standalone, alone = speed.get('train_rate'), speed.get('policy_p50_ms')
    return dict(
        learner=100 * run['train_fps'] / standalone if standalone else NAN,
        batch=run['policy_batch_ms'] / alone if alone else NAN,
        busy=NAN if run.get('gpu_busy') is None else run['gpu_busy'],
        fps=run.get('steady_fps', NAN))


def targets_table(runs, speed):
    """The GPU targets of a policy process against both mode runs."""
    thread, process = (target_figures(runs.get(m), speed) for m in MODES)
    ratio = process['fps'] / thread['fps'] if thread['fps'] else NAN
    rows = [
        ('learner at least 85% of standalone', 'learner', '{:.0f}%',
         process['learner'] >= 85, process['learner']),
        ('policy batch at most 2x the policy alone', 'batch', '{:.1f}x',
         process['batch'] <= 2, process['batch']),
        ('GPU busy at least 90%', 'busy', '{:.0f}%', process['busy'] >= 90,
         process['busy']),
        ('env steps/s at least 1.3x the thread mode', 'fps', '{:.0f}',
         ratio >= 1.3, ratio)]
    lines = ['| target of a policy process | thread | process | met |',
             '|---|---|---|---|']
    for name, key, form, ok, value in rows:
        cells = [_shown(thread[key], form), _shown(process[key], form)]
        if key == 'fps':
            cells[1] += f" ({_shown(ratio, '{:.2f}x')})"
        met = '–' if value != value else ('yes' if ok else 'no')
        lines.append(f"| {name} | {' | '.join(cells)} | {met} |")
    return '\n'.join(lines)


def _shown(value, form):
    return '–' if value != value else form.format(value)


def render(args, device, rows, seconds):
    head = (f"gpu_check on {device}, --configs {' '.join(args.configs)}, "
            f"{seconds:.0f} s in all, "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    lines = [head, '', '| measure | result |', '|---|---|']
    lines += [f'| {name} | {text} |' for name, text in rows]
    if not checkout.original_checkout():
        lines.append(f'| the original\'s agent code | not measured: '
                     f'${checkout.ORIGINAL_ENV} is not set |')
    return '\n'.join(lines)


if __name__ == '__main__':
    sys.exit(main())
