"""Runs a trained agent in the envs without training."""

import elements

from embodied.core import checkpoint as cplib
from embodied.run import arguments
from embodied.run import ending
from embodied.run import episodes as episodeslib
from embodied.run import loop as looplib
from embodied.run import saving
from embodied.run import videos
from embodied.run.reporting import prefix


@ending.in_one_line
def eval_only(make_agent, make_env, make_logger, args):
    """Steps `args.envs` envs with the agent's policy in 'eval' mode until
    `args.steps` env steps, logging episode statistics. The agent comes from
    `run.from_checkpoint`, or from the agent checkpoint of `args.logdir`.
    With `run.eval_video` N > 0, the image observations of the first N
    finished episodes are saved as GIFs in `logdir/videos`.
    The step count is saved under ckpt/eval so a rerun continues it, without
    touching the training checkpoints of the same logdir."""
    args = arguments.normalize(args)
    saving.refuse_pickles(args, eval_only=True)
    agent = make_agent()
    logger = make_logger()

    loop = looplib.Loop(args, logger)
    step = loop.step
    stats = episodeslib.EpisodeStats(logger)

    source = args.from_checkpoint or args.logdir
    if not args.from_checkpoint and not saving.directory(
            args.logdir, 'agent').exists():
        raise FileNotFoundError(
            f'eval_only needs a trained agent: set run.from_checkpoint, or '
            f'use a logdir with a checkpoint ({args.logdir}/ckpt/agent).')
    saving.load_agent(agent, source, args.from_checkpoint_regex,
                      saving.trust_pickle(args))

    cp = cplib.Checkpoint(
        elements.Path(args.logdir) / 'ckpt' / 'eval', args.save_keep,
        saving.trust_pickle(args))
    cp.step = step
    cp.load_or_save()

    driver = loop.driver(make_env, range(args.envs), stats.add)
    if args.eval_video > 0:
        driver.on_step(videos.EpisodeVideos(
            elements.Path(args.logdir) / 'videos', args.eval_video, step).add)

    loop.begin('Start evaluation')
    policy = lambda *a: agent.policy(*a, mode='eval')
    driver.reset(agent.init_policy)
    try:
        loop.run(driver, policy, cp, {'epstats': stats})
        loop.finish(cp, stats, prefix(stats.result(), 'epstats'))
    finally:
        driver.close()
        logger.close()
