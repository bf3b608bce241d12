"""Single-process training with periodic evaluation episodes."""

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
from embodied.run.train import restore, should_stop, write_metrics


def train_eval(
        make_agent, make_replay_train, make_replay_eval, make_env_train,
        make_env_eval, make_stream, make_logger, args):
    """Like `train`, and every `args.report_every` seconds runs
    `args.eval_eps` episodes in `args.eval_envs` eval envs (policy mode
    'eval'), whose data goes to the eval replay and `eval_episode/` metrics."""
    args = arguments.with_defaults(args)
    agent = make_agent()
    replay_train = make_replay_train()
    replay_eval = make_replay_eval()
    logger = make_logger()

    step = logger.step
    usage = elements.Usage(**args.usage)
    train_stats = episodeslib.EpisodeStats(logger, 'episode')
    eval_stats = episodeslib.EpisodeStats(logger, 'eval_episode')
    policy_fps = elements.FPS()
    should_log = embodied.LocalClock(args.log_every)
    should_report = embodied.LocalClock(args.report_every, first=True)
    should_save = embodied.LocalClock(args.save_every)

    fns = [bind(make_env_train, i) for i in range(args.envs)]
    train_driver = embodied.Driver(fns, parallel=not args.debug)
    trainer = learning.RatioTrainer(
        agent, replay_train, make_stream, args, step)
    train_driver.on_step(lambda tran, _: step.increment())
    train_driver.on_step(lambda tran, _: policy_fps.step())
    train_driver.on_step(replay_train.add)
    train_driver.on_step(train_stats.add)
    train_driver.on_step(trainer.on_step)

    eval_envs = max(1, args.eval_envs)
    fns = [bind(make_env_eval, args.envs + i) for i in range(eval_envs)]
    eval_driver = embodied.Driver(fns, parallel=not args.debug)
    eval_driver.on_step(replay_eval.add)
    eval_driver.on_step(eval_stats.add)
    eval_driver.on_step(lambda tran, _: policy_fps.step())
    stream_eval = iter(agent.stream(make_stream(replay_eval, 'eval')))
    carry_eval = agent.init_report(args.batch_size)

    cp = saving.RunCheckpoint(args.logdir)
    cp['agent'].agent = agent
    cp['replay'].replay_train = replay_train
    cp['replay'].replay_eval = replay_eval
    cp['logger'].step = step
    restore(cp, agent, args)

    print('Start training loop')
    start = time.monotonic()
    eta = progress.Eta(args.steps, args.duration, int(step))
    train_policy = lambda *a: agent.policy(*a, mode='train')
    eval_policy = lambda *a: agent.policy(*a, mode='eval')
    train_driver.reset(agent.init_policy)
    try:
        with stopping.StopSignal() as stop:
            while not should_stop(step, start, stop, args):

                if should_report(step):
                    print('Evaluation')
                    eval_driver.reset(agent.init_policy)
                    eval_driver(eval_policy, episodes=args.eval_eps)
                    logger.add(eval_stats.result(), prefix='eval_epstats')
                    if len(replay_train):
                        logger.add(trainer.report(), prefix='report')
                    if len(replay_eval):
                        carry_eval, mets = learning.report_on(
                            agent, stream_eval, args, carry_eval)
                        logger.add(mets, prefix='eval')

                train_driver(train_policy, steps=10)

                if should_log(step):
                    print(f'[Progress] {eta.line(step)}', flush=True)
                    write_metrics(
                        logger, usage, policy_fps, {'epstats': train_stats},
                        {'replay': replay_train, 'replay_eval': replay_eval},
                        trainer)

                if should_save(step):
                    cp.save(int(step))

            cp.save(int(step))
            logger.add(trainer.metrics())
            logger.write()
            print(f'[Summary] {eta.summary(step, train_stats.recent_score())}',
                  flush=True)
    finally:
        train_driver.close()
        eval_driver.close()
        logger.close()
