"""One command for a GPU machine: the agent's own speed, the parallel
runner on the GPU, and a relaunch from the compile cache, in one table.

    python -m embodied.perf.gpu_check                # about 8 minutes
    EMBODIED_ORIGINAL_DREAMERV3=/path/to/dreamerv3 \\
        python -m embodied.perf.gpu_check            # plus the original's code
    python -m embodied.perf.gpu_check --quick        # `debug`, a minute on CPU

Steps, each in fresh processes:

1. `agent_speed` of our DreamerV3 at `--configs` (default `atari size12m`),
   compiled from scratch into a new persistent cache: train steps/s alone,
   policy p50 at batch 16, the cold build; with $EMBODIED_ORIGINAL_DREAMERV3
   set, the same for the original's agent code on our base.
2. `--script parallel` at `--configs` with `--envs` envs and no eval envs
   for `--seconds`, on that cache: env steps/s (whole run and steady),
   train steps/s and the learner's rate as % of step 1's standalone rate,
   the policy batch ms inside the runner (first request of a batch to its
   reply), and how busy the GPU was over the steady window
   (`nvidia-smi`'s utilization, polled; '–' without it).
3. The same command again on the same logdir (a resume) for
   `--relaunch_seconds`: the seconds its agent took to compile (from the
   cache) and from launch to the first env step.

`--quick` runs the same steps at `debug` on the dummy task with 4 envs and
short runs that stop at an env step count rather than after seconds, so a
slow compile on a busy machine cannot use up the run (the CI test runs it
on CPU). `--markdown FILE` also writes the
table.
"""

import argparse
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import types

from embodied.perf import agent_speed
from embodied.perf import original
from embodied.perf import throughput

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent


def make_parser():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--quick', action='store_true',
                        help='debug config, dummy task, short runs (CI)')
    parser.add_argument('--configs', nargs='+', default=['atari', 'size12m'])
    parser.add_argument('--envs', type=int, default=16)
    parser.add_argument('--seconds', type=float, default=180)
    parser.add_argument('--relaunch_seconds', type=float, default=30)
    parser.add_argument('--train_steps', type=int, default=50)
    parser.add_argument('--policy_calls', type=int, default=200)
    parser.add_argument(
        '--cache', default='',
        help='keep the compilation cache in this folder (default: a '
             'temporary one); it must not exist yet, so the build is cold')
    parser.add_argument('--markdown', default='')
    return parser


def main(argv=None):
    args = make_parser().parse_args(argv)
    if args.quick:
        args.configs = ['debug']
        args.envs, args.seconds, args.relaunch_seconds = 4, 25, 20
        args.train_steps, args.policy_calls = 5, 20
    gpu = shutil.which('nvidia-smi') is not None
    platform = 'cuda' if gpu else 'cpu'
    start = time.monotonic()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        cache = pathlib.Path(args.cache) if args.cache else tmp / 'jaxcache'
        if cache.exists() and any(cache.iterdir()):
            sys.exit(f'--cache {cache}: the folder is not empty; the cold '
                     f'build needs an empty cache.')
        speed = agent_speeds(args, platform, tmp, cache)
        rows += [(f'agent_speed: {name}', format_speed(result))
                 for name, result in speed.items()]
        logdir = tmp / 'run'
        standalone = speed.get('ours', {}).get('train_rate')
        run = run_parallel(args, platform, logdir, cache, args.seconds, 400)
        rows.append((f'parallel, {args.envs} envs, {args.seconds:g} s',
                     format_run(run, standalone)))
        again = run_parallel(
            args, platform, logdir, cache, args.relaunch_seconds, 800)
        rows.append(('relaunch (resume, compile cache)',
                     f"compile {again['compile_s']:.1f} s, first env step "
                     f"{again['first_step_s']:.1f} s after launch"))
    device = speed['ours']['device'] if 'ours' in speed else platform
    table = render(args, device, rows, time.monotonic() - start)
    print(table, flush=True)
    if args.markdown:
        pathlib.Path(args.markdown).write_text(table + '\n')


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
    flags = ['--configs', *args.configs, '--jax.debug', 'False',
             '--jax.platform', platform]
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
    return results


def run_parallel(args, platform, logdir, cache, seconds, quick_steps):
    """One `--script parallel` run (a resume when `logdir` has a run) for
    `seconds`, or with `--quick` to the run's env step `quick_steps`; its
    summary figures, and the GPU's mean utilization over the steady
    window."""
    flags = ['--configs', *args.configs, '--run.eval_envs', '0',
             '--run.log_every', '10', '--jax.platform', platform]
    if args.quick:
        flags += ['--task', 'dummy_disc', '--run.duration', '0',
                  '--run.steps', quick_steps]
    env = {'EMBODIED_JAX_CACHE': str(cache),
           # Only the agent's process uses the GPU; the runner's own setting.
           'JAX_PLATFORMS': 'cpu' if platform == 'cpu' else None}
    print(f'parallel: {seconds:g} s at {" ".join(args.configs)}, '
          f'{args.envs} envs ...', flush=True)
    with GpuUtilization() as gpu:
        output, _, _, lines, _ = throughput.launch(
            ROOT, 'embodied.run.parallel', seconds, '--script', 'parallel',
            '--logdir', str(logdir), '--run.envs', args.envs, *flags,
            env=env, common=())
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
        gpu_busy=gpu.mean(*(w[0] for w in window)) if window else None)
    print(f'parallel: {summary[-1]}', flush=True)
    return values


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


def format_speed(result):
    return (f"{result['train_rate']:.2f} train steps/s, policy p50 "
            f"{result['policy_p50_ms']:.2f} ms at batch 16, build "
            f"{result['build']:.1f} s + first train "
            f"{result['first_train']:.1f} s + policy compile "
            f"{result['policy_compile']:.1f} s, peak "
            f"{result['peak_gb']:.2f} GiB ({result['peak_kind']})")


def format_run(run, standalone):
    learner = (f"{100 * run['train_fps'] / standalone:.0f}% of standalone"
               if standalone else 'standalone rate unknown')
    busy = ('–' if run['gpu_busy'] is None else f"{run['gpu_busy']:.0f}%")
    return (f"{run['env_fps']:.0f} env steps/s ({run['steady_fps']:.0f} "
            f"steady), {run['train_fps']:.2f} train steps/s ({learner}), "
            f"policy batch {run['policy_batch_ms']:.1f} ms of "
            f"{run['policy_batch_envs']:.1f} envs, GPU busy {busy}, compile "
            f"{run['compile_s']:.1f} s, first env step "
            f"{run['first_step_s']:.1f} s")


def render(args, device, rows, seconds):
    head = (f"gpu_check on {device}, --configs {' '.join(args.configs)}, "
            f"{seconds:.0f} s in all, "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    lines = [head, '', '| measure | result |', '|---|---|']
    lines += [f'| {name} | {text} |' for name, text in rows]
    if not original.source():
        lines.append(f'| the original\'s agent code | not measured: '
                     f'${original.ENV} is not set |')
    return '\n'.join(lines)


if __name__ == '__main__':
    sys.exit(main())
