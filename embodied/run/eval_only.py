"""Runs a trained agent in the envs without training."""

import time
from functools import partial as bind

import elements

import embodied
from embodied.core import checkpoint as cplib
from embodied.run import arguments
from embodied.run import episodes as episodeslib
from embodied.run import progress
from embodied.run import saving
from embodied.run import stopping
from embodied.run import videos
from embodied.run.train import should_stop, write_metrics


def eval_only(make_agent, make_env, make_logger, args):
    """Steps `args.envs` envs with the agent's policy in 'eval' mode until
    `args.steps` env steps, logging episode statistics. The agent comes from
    `run.from_checkpoint`, or from the agent checkpoint of `args.logdir`.
    With `run.eval_video` N > 0, the image observations of the first N
    finished episodes are saved as GIFs in `logdir/videos`.
    The step count is saved under ckpt/eval so a rerun continues it, without
    touching the training checkpoints of the same logdir."""
    args = arguments.with_defaults(args)
    agent = make_agent()
    logger = make_logger()

    step = logger.step
    usage = elements.Usage(**args.usage)
    stats = episodeslib.EpisodeStats(logger)
    policy_fps = elements.FPS()
    should_log = embodied.LocalClock(args.log_every)
    should_save = embodied.LocalClock(args.save_every)

    source = args.from_checkpoint or args.logdir
    if not args.from_checkpoint and not saving.directory(
            args.logdir, 'agent').exists():
        raise FileNotFoundError(
            f'eval_only needs a trained agent: set run.from_checkpoint, or '
            f'use a logdir with a checkpoint ({args.logdir}/ckpt/agent).')
    saving.load_agent(agent, source, args.from_checkpoint_regex)

    cp = cplib.Checkpoint(elements.Path(args.logdir) / 'ckpt' / 'eval')
    cp.step = step
    cp.load_or_save()

    fns = [bind(make_env, i) for i in range(args.envs)]
    driver = embodied.Driver(fns, parallel=not args.debug)
    driver.on_step(lambda tran, _: step.increment())
    driver.on_step(lambda tran, _: policy_fps.step())
    driver.on_step(stats.add)
    if args.eval_video > 0:
        driver.on_step(videos.EpisodeVideos(
            elements.Path(args.logdir) / 'videos', args.eval_video, step).add)

    print('Start evaluation')
    start = time.monotonic()
    eta = progress.Eta(args.steps, args.duration, int(step))
    policy = lambda *a: agent.policy(*a, mode='eval')
    driver.reset(agent.init_policy)
    try:
        with stopping.StopSignal() as stop:
            while not should_stop(step, start, stop, args):
                driver(policy, steps=10)
                if should_log(step):
                    print(f'[Progress] {eta.line(step)}', flush=True)
                    write_metrics(
                        logger, usage, policy_fps, {'epstats': stats})
                if should_save(step):
                    cp.save(int(step))
            cp.save(int(step))
            logger.add(stats.result(), prefix='epstats')
            logger.write()
            print(f'[Summary] {eta.summary(step, stats.recent_score())}',
                  flush=True)
    finally:
        driver.close()
        logger.close()
