"""Single-process training with periodic evaluation episodes."""

import embodied
from embodied.run import arguments
from embodied.run import ending
from embodied.run import episodes as episodeslib
from embodied.run import loop as looplib
from embodied.run import ratio_trainer
from embodied.run import reporting


@ending.in_one_line
def train_eval(
        make_agent, make_replay_train, make_replay_eval, make_env_train,
        make_env_eval, make_stream, make_logger, args):
    """Like `train`, and every `args.report_every` seconds runs
    `args.eval_eps` episodes in `args.eval_envs` eval envs (policy mode
    'eval'), whose data goes to the eval replay and `eval_episode/` metrics."""
    args = arguments.normalize(args)
    agent = make_agent()
    replay_train = make_replay_train()
    replay_eval = make_replay_eval()
    logger = make_logger()

    loop = looplib.Loop(args, logger)
    step = loop.step
    train_stats = episodeslib.EpisodeStats(logger, 'episode')
    eval_stats = episodeslib.EpisodeStats(logger, 'eval_episode')
    should_report = embodied.LocalClock(args.report_every, first=True)

    trainer = ratio_trainer.RatioTrainer(
        agent, replay_train, make_stream, args, step)
    train_driver = loop.driver(
        make_env_train, range(args.envs), replay_train.add, train_stats.add,
        trainer.on_step)
    eval_envs = range(args.envs, args.envs + max(1, args.eval_envs))
    eval_driver = loop.driver(
        make_env_eval, eval_envs, replay_eval.add, eval_stats.add,
        count=False)
    stream_eval = iter(agent.stream(make_stream(replay_eval, 'eval')))
    carry_eval = agent.init_report(args.batch_size)

    cp = looplib.restore(
        args, agent, logger, replay_train=replay_train, replay_eval=replay_eval)

    def evaluate():
        nonlocal carry_eval
        if not should_report(step):
            return
        print('Evaluation')
        eval_driver.reset(agent.init_policy)
        eval_driver(eval_policy, episodes=args.eval_eps)
        logger.add(eval_stats.result(), prefix='eval_epstats')
        if len(replay_train):
            logger.add(trainer.report(), prefix='report')
        if len(replay_eval):
            carry_eval, mets = reporting.report_on(
                agent, stream_eval, args, carry_eval)
            logger.add(mets, prefix='eval')

    loop.begin('Start training loop')
    train_policy = lambda *a: agent.policy(*a, mode='train')
    eval_policy = lambda *a: agent.policy(*a, mode='eval')
    train_driver.reset(agent.init_policy)
    try:
        loop.run(
            train_driver, train_policy, cp, {'epstats': train_stats},
            {'replay': replay_train, 'replay_eval': replay_eval}, trainer,
            before=evaluate)
        loop.finish(cp, train_stats, trainer.metrics())
    finally:
        trainer.close()
        reporting.close_stream(stream_eval)
        train_driver.close()
        eval_driver.close()
        logger.close()
