"""Single-process training: envs stepped by a driver, training in between."""

import embodied
from embodied.run import arguments
from embodied.run import ending
from embodied.run import episodes as episodeslib
from embodied.run import loop as looplib
from embodied.run import ratio_trainer


@ending.in_one_line
def train(make_agent, make_replay, make_env, make_stream, make_logger, args):
    """Collects data with `args.envs` envs and trains at `args.train_ratio`
    (replayed steps per env step) until `args.steps` env steps or
    `args.duration` seconds; SIGTERM/SIGINT stop it early. Saves every
    `args.save_every` seconds and at the end; a rerun on the same logdir
    resumes agent, replay and step."""
    args = arguments.normalize(args)
    agent = make_agent()
    replay = make_replay()
    logger = make_logger()

    loop = looplib.Loop(args, logger)
    step = loop.step
    stats = episodeslib.EpisodeStats(logger)
    should_report = embodied.GlobalClock(args.report_every)
    trainer = ratio_trainer.RatioTrainer(agent, replay, make_stream, args, step)
    driver = loop.driver(
        make_env, range(args.envs), replay.add, stats.add, trainer.on_step)

    cp = looplib.restore(args, agent, logger, replay=replay)

    def report():
        if should_report(step) and len(replay):
            logger.add(trainer.report(), prefix='report')

    loop.begin('Start training loop')
    policy = lambda *a: agent.policy(*a, mode='train')
    driver.reset(agent.init_policy)
    try:
        loop.run(driver, policy, cp, {'epstats': stats}, {'replay': replay},
                 trainer, before=report)
        loop.finish(cp, stats, trainer.metrics())
    finally:
        trainer.close()
        driver.close()
        logger.close()
