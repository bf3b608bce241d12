"""Single-process training: envs stepped by a driver, training in between."""

import time
from functools import partial as bind

import elements

import embodied
from embodied.run import arguments
from embodied.run import episodes as episodeslib
from embodied.run import learning
from embodied.run import progress
from embodied.run import saving
from embodied.run import stopping
from embodied.run import timing


def train(make_agent, make_replay, make_env, make_stream, make_logger, args):
    """Collects data with `args.envs` envs and trains at `args.train_ratio`
    (replayed steps per env step) until `args.steps` env steps or
    `args.duration` seconds; SIGTERM/SIGINT stop it early. Saves every
    `args.save_every` seconds and at the end; a rerun on the same logdir
    resumes agent, replay and step."""
    args = arguments.with_defaults(args)
    agent = make_agent()
    replay = make_replay()
    logger = make_logger()

    step = logger.step
    usage = elements.Usage(**args.usage)
    stats = episodeslib.EpisodeStats(logger)
    policy_fps = elements.FPS()
    should_log = embodied.LocalClock(args.log_every)
    should_report = embodied.LocalClock(args.report_every)
    should_save = embodied.LocalClock(args.save_every)

    fns = [bind(make_env, i) for i in range(args.envs)]
    driver = embodied.Driver(fns, parallel=not args.debug)
    trainer = learning.RatioTrainer(agent, replay, make_stream, args, step)
    driver.on_step(lambda tran, _: step.increment())
    driver.on_step(lambda tran, _: policy_fps.step())
    driver.on_step(replay.add)
    driver.on_step(stats.add)
    driver.on_step(trainer.on_step)

    cp = saving.RunCheckpoint(args.logdir)
    cp['agent'].agent = agent
    cp['replay'].replay = replay
    cp['logger'].step = step
    restore(cp, agent, args)

    print('Start training loop')
    start = time.monotonic()
    eta = progress.Eta(args.steps, args.duration, int(step))
    policy = lambda *a: agent.policy(*a, mode='train')
    driver.reset(agent.init_policy)
    try:
        with stopping.StopSignal() as stop:
            while not should_stop(step, start, stop, args):
                driver(policy, steps=10)

                if should_report(step) and len(replay):
                    logger.add(trainer.report(), prefix='report')

                if should_log(step):
                    print(f'[Progress] {eta.line(step)}', flush=True)
                    write_metrics(
                        logger, usage, policy_fps, {'epstats': stats},
                        {'replay': replay}, trainer)

                if should_save(step):
                    cp.save(int(step))

            cp.save(int(step))
            logger.add(trainer.metrics())
            logger.write()
            print(f'[Summary] {eta.summary(step, stats.recent_score())}',
                  flush=True)
    finally:
        driver.close()
        logger.close()


def restore(cp, agent, args):
    """Resumes the run in `args.logdir`, or starts from `run.from_checkpoint`
    when there is nothing to resume."""
    if args.from_checkpoint and cp.latest() is None:
        saving.load_agent(
            agent, args.from_checkpoint, args.from_checkpoint_regex)
    tag = cp.load_or_save(0)
    if tag is not None:
        print(f'Resumed from the save at step {tag}.')


def write_metrics(
        logger, usage, policy_fps, episodes, replays=None, trainer=None):
    """Writes the periodic metrics of a single-process runner: `episodes`
    maps prefixes to EpisodeStats, `replays` prefixes to replays."""
    if trainer:
        logger.add(trainer.metrics())
    for prefix, stats in episodes.items():
        logger.add(stats.result(), prefix=prefix)
    for prefix, replay in (replays or {}).items():
        logger.add(replay.stats(), prefix=prefix)
    logger.add(usage.stats(), prefix='usage')
    logger.add({'fps/policy': policy_fps.result()})
    logger.add(timing.timer_metrics('timer'))
    logger.write()


def should_stop(step, start, stop, args):
    if stop.requested:
        return True
    if step >= args.steps:
        print(f'Reached run.steps: step {int(step)} of {int(args.steps)}.')
        return True
    if args.duration and time.monotonic() - start >= args.duration:
        print(f'Reached run.duration of {args.duration} seconds '
              f'at step {int(step)}.')
        return True
    return False
