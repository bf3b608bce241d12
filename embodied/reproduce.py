"""Does this install reproduce DreamerV3's published curves?

    python -m embodied.reproduce dmc_proprio --tasks dmc_cartpole_balance \\
        dmc_walker_walk --seeds 0 1 2 --steps 40000

runs the original's block of the suite unchanged (`--configs dmc_proprio`,
then the blocks of `--configs`: by default `gpu` where `nvidia-smi` exists,
which sets the original's 16 envs, 4 eval envs and 5e6-step replay) on each
task and seed up to `--steps` env steps, as one sweep (`embodied.sweep`,
each run in `<logdir>/<index>-<task>-<method>-<seed>`), then prints the
reproduction table of `python -m embodied.plot <logdir> --published SUITE`
(`embodied.plot.verdict`) and writes it as `reproduction.md`, with the
curves over the published band in `bands.png`, into the logdir.

Before it starts, it says what it will run and, from a short timing of the
first train steps at the runs' config (`embodied.perf.agent_speed`, compiled
into the compilation cache the runs then load from), about how long that
takes on this machine. The same command again skips the finished runs and
resumes the others (a sweep), so a larger `--steps` extends them.

The env-step axis is the original's: `--steps` and the table count the steps
that the original's driver and logger count, reset steps included (an
episode of 1000 steps is 1001), times the suite's action repeat (the
logger's multiplier: `env.atari100k.repeat` is 4, so `--steps 400000` is
`run.steps 100000`), which is the axis of the published files. Flags after
`--` go to every run (`-- --run.envs 1`).
"""

import argparse
import dataclasses
import math
import os
import pathlib
import shutil
import sys
import tempfile
import types

DEFAULT_LOGDIR = '~/logdir/reproduce-{suite}'
TIMING_STEPS = 20


@dataclasses.dataclass
class Plan:
    """What a reproduction runs."""

    suite: str          # the published suite (a file prefix)
    block: str          # our config block that runs it
    tasks: list         # our task names
    seeds: list
    steps: float        # the budget, on the published axis
    run_steps: int      # run.steps of each run
    blocks: list        # --configs of each run
    flags: list         # flags of every run (without task, seed, logdir)
    logdir: pathlib.Path
    runs: list          # embodied.sweep Runs
    config: object      # the first run's config
    repeat: int         # the logger's multiplier of the suite
    env_block: str      # the env.<name> block whose repeat that is


def main(argv=None):
    from embodied.config import UsageError
    args, extra = parse_args(argv)
    try:
        plan = make_plan(args, extra)
    except (UsageError, ValueError) as e:
        print(f'error: {e}', file=sys.stderr, flush=True)
        return 2
    say(describe(plan, args.parallel))
    if args.dry:
        return 0
    from embodied import sweep
    pending = [run for run in plan.runs if not sweep.finished(run)]
    if pending and (args.timing_steps or args.estimate):
        say(estimate(plan, pending, args.timing_steps or TIMING_STEPS,
                     args.parallel))
    if args.estimate:
        return 0
    code = sweep.run_local(plan.runs, args.parallel, say=say)
    table = report(plan, args)
    return code or (0 if table else 1)


def say(text):
    print(text, flush=True)


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog='python -m embodied.reproduce',
        description=__doc__.split('\n\n')[0],
        epilog='Flags after -- go to every run (python -m embodied.main).')
    parser.add_argument(
        'suite', help='a suite DreamerV3 published: dmc_proprio, dmc_vision, '
                      'atari100k, atari57 (block atari), dmlab30 (dmlab), '
                      'procgen, minecraft_diamond (minecraft)')
    parser.add_argument('--tasks', nargs='+', default=None,
                        help='tasks, ours or as published (default: every '
                             'published task of the suite)')
    parser.add_argument('--seeds', nargs='+', type=int, default=None,
                        help='seeds (default: as many as were published, '
                             'from 0)')
    parser.add_argument('--steps', type=float, default=0,
                        help='env steps of each run, on the published axis '
                             '(default: the published runs\' last)')
    parser.add_argument('--logdir', default=DEFAULT_LOGDIR,
                        help='the sweep\'s folder (default: '
                             f'{DEFAULT_LOGDIR})')
    parser.add_argument('--configs', nargs='*', default=None,
                        help='blocks after the suite\'s (default: gpu where '
                             'nvidia-smi exists, else none)')
    parser.add_argument('--parallel', type=int, default=1,
                        help='runs at once (they share this machine\'s '
                             'devices)')
    parser.add_argument('--timing_steps', type=int, default=TIMING_STEPS,
                        help='train steps timed for the estimate (0: none)')
    parser.add_argument('--dry', action='store_true',
                        help='say what would run, start nothing')
    parser.add_argument('--estimate', action='store_true',
                        help='say what would run and time it, start no run')
    parser.add_argument('--reps', type=int, default=None,
                        help='bootstrap replications of the table\'s '
                             'intervals')
    args, extra = parser.parse_known_args(argv)
    if extra and extra[0] == '--':
        extra = extra[1:]
    unknown = [x for x in extra if x.startswith('-') and not x.startswith('--')]
    if unknown:
        parser.error(f'unknown option {unknown[0]}')
    return args, extra


def make_plan(args, extra):
    """The Plan of the command line; a ValueError or UsageError names what
    is wrong before anything starts."""
    from embodied import factories
    from embodied import main as mainlib
    from embodied import sweep
    from embodied.plot import bins as binslib
    from embodied.plot import published, tasks as taskslib
    suite = published.suite_name(args.suite)
    if not suite:
        raise ValueError(
            f"{args.suite}: not a suite DreamerV3 published (one of "
            f"{', '.join(published.SUITES)}, or the blocks "
            f"{', '.join(published.BLOCKS)}).")
    block = published.block(suite)
    records = published.load(suite)
    known = sorted({r.task for r in records})
    chosen = args.tasks or [taskslib.run_task(t, suite) for t in known]
    for task in chosen:
        if not taskslib.find(task, known):
            raise ValueError(
                f'--tasks {task}: DreamerV3 published no runs of it in '
                f"{suite} (it has {', '.join(known[:6])}"
                f"{' ...' if len(known) > 6 else ''}).")
    chosen = [taskslib.run_task(t, suite) for t in chosen]
    if args.seeds is None:
        counts = {}
        for record in records:
            counts[record.task] = counts.get(record.task, 0) + 1
        seeds = list(range(max(counts.values())))
    else:
        seeds = args.seeds
    for name in ('--run.steps', '--task', '--seed', '--logdir'):
        if any(x == name or x.startswith(name + '=') for x in extra):
            raise ValueError(
                f'{name}: set by the reproduction (use --steps, --tasks, '
                f'--seeds, --logdir).')
    if args.configs is None:
        blocks = ['gpu'] if shutil.which('nvidia-smi') else []
    else:
        blocks = list(args.configs)
    steps = args.steps or max(
        float(binslib.grid([r for r in records if r.task == t]).xs[-1])
        for t in known)
    head = ['--configs', block, *blocks]
    if '--script' not in extra:
        head += ['--script', 'parallel']
    probe = mainlib.parse([*head, '--task', chosen[0], *extra])
    env_block = factories.env_block(probe)
    repeat = int(probe.env.get(env_block, {}).get('repeat', 1))
    run_steps = int(math.ceil(steps / repeat))
    flags = [*head, '--run.steps', str(run_steps), *extra]
    logdir = pathlib.Path(os.path.expanduser(
        args.logdir.format(suite=suite))).absolute()
    runs = sweep.plan(logdir, flags, tasks=chosen, seeds=seeds)
    config = mainlib.parse([*flags, '--task', chosen[0]])
    return Plan(suite, block, chosen, seeds, steps, run_steps, blocks, flags,
                logdir, runs, config, repeat, env_block)


def updates_per_run(plan):
    """Train steps of one run: the env steps times the train ratio over the
    steps of a batch (the limiter's rate)."""
    config = plan.config
    return plan.run_steps * float(config.run.train_ratio) / (
        config.batch_size * config.batch_length)


def describe(plan, parallel):
    from embodied.plot import published
    config = plan.config
    lines = [
        f"Reproducing DreamerV3's {plan.suite} "
        f'({published.path(plan.suite).name}): '
        f"{plural(len(plan.tasks), 'task')} x "
        f"{plural(len(plan.seeds), 'seed')} = "
        f"{plural(len(plan.runs), 'run')} in {plan.logdir}, "
        f'{parallel} at a time.',
        f"  tasks: {' '.join(plan.tasks)}",
        f"  seeds: {' '.join(str(s) for s in plan.seeds)}",
        f"  each run: python -m embodied.main {' '.join(plan.flags)} "
        f'--task TASK --seed SEED',
        f'  blocks: {plan.block} (the original\'s, unchanged)'
        + (f", then {' '.join(plan.blocks)}" if plan.blocks else
           ' with this package\'s laptop defaults (no gpu block: '
           f'{config.run.envs} envs, replay {int(config.replay.size):,})'),
        f'  budget: {plan.steps:g} env steps on the published axis (the '
        f"original's driver's steps, reset steps included, times "
        f'env.{plan.env_block}.repeat = {plan.repeat}): run.steps '
        f'{plan.run_steps}',
        f'  train: ratio {config.run.train_ratio:g}, batch '
        f'{config.batch_size} x {config.batch_length}: '
        f'{updates_per_run(plan):.0f} updates a run',
    ]
    return '\n'.join(lines)


def plural(count, word):
    return f'{count} {word}' + ('' if count == 1 else 's')


def estimate(plan, pending, train_steps, parallel):
    """A line on how long the pending runs take, from timing the first
    train steps of the first task's agent."""
    from embodied.perf import agent_speed
    say(f'Timing {train_steps} train steps of {plan.tasks[0]} '
        f'(compiling first) ...')
    flags = [x for x in plan.flags]
    flags += ['--task', plan.tasks[0]]
    options = types.SimpleNamespace(
        train_steps=train_steps, policy_calls=3, policy_batch=1,
        report_calls=0)
    setup = ([str(agent_speed.ROOT)], 'ours', [])
    with tempfile.TemporaryDirectory() as scratch:
        try:
            result = agent_speed.measure(
                setup, flags, options, scratch, cache=compile_cache())
        except (RuntimeError, OSError) as e:
            last = str(e).strip().splitlines()[-1:] or ['']
            return f'Could not time the train steps: {last[0]}'
    rate = result['train_rate']
    per_run = updates_per_run(plan) / rate
    total = per_run * len(pending)
    return (
        f'Train steps/s: {rate:.2f} on {result["device"]} (the agent built '
        f'and compiled in {result["build"] + result["first_train"]:.0f} s). '
        f'About {duration(per_run)} a run from its train steps alone (the '
        f'env steps and the compile not counted); '
        f"{plural(len(pending), 'unfinished run')} one after another: about "
        f'{duration(total)}'
        + ('' if parallel <= 1 else
           f' ({parallel} at a time share the device, which shortens this '
           f'only where one run leaves it idle)') + '.')


def compile_cache():
    """The folder the runs' persistent compilation cache uses (as
    `embodied.jax.runtime` picks it), so the timing's compile serves them;
    None where it is off."""
    setting = os.environ.get('EMBODIED_JAX_CACHE', '')
    if setting.lower() == 'off':
        return None
    return setting or str(pathlib.Path('~/.cache/embodied/jax').expanduser())


def duration(seconds):
    if seconds < 120:
        return f'{seconds:.0f} s'
    if seconds < 2 * 3600:
        return f'{seconds / 60:.0f} min'
    return f'{seconds / 3600:.1f} h'


def report(plan, args):
    """Prints the reproduction table of the runs that wrote scores, writes
    reproduction.md and the plot into the logdir; returns the text or ''."""
    from embodied import plot
    from embodied.plot import intervals
    folders = [run.logdir for run in plan.runs
               if (run.logdir / 'scores.jsonl').is_file()]
    if not folders:
        say('No run has finished an episode yet: no table.')
        return ''
    try:
        result = plot.compare_runs(
            folders, [plan.suite], reps=args.reps or intervals.REPS)
    except ValueError as e:
        say(f'No table: {e}')
        return ''
    text = plot.verdict.text(result)
    say('')
    say(text.rstrip())
    markdown = plan.logdir / 'reproduction.md'
    markdown.write_text(plot.verdict.markdown(result))
    say(f'Wrote {markdown}')
    try:
        for path in plot.draw_bands(result, plan.logdir):
            say(f'Wrote {path}')
    except ImportError as e:
        say(f'No plot: {e}')
    return text


if __name__ == '__main__':
    sys.exit(main())
