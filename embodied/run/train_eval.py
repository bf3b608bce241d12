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
    should_report = embodied.LocalClock(args.report_every, first=True)

    trainer = ratio_trainer.RatioTrainer(
        agent, replay_train, make_stream, args, step)
    train_driver = loop.driver(
        make_env_train, range(args.envs), replay_train.add, train_stats.add,
        trainer.on_step)
    evaluation = Evaluation(
        agent, replay_eval, make_env_eval, make_stream, loop, logger, args)

    cp = looplib.restore(
        args, agent, logger, replay_train=replay_train, replay_eval=replay_eval)

    def evaluate():
        if not should_report(step):
            return
        print('Evaluation')
        evaluation.run_episodes()
        if len(replay_train):
            logger.add(trainer.report(), prefix='report')
        evaluation.report()

    loop.begin('Start training loop')
    train_policy = lambda *a: agent.policy(*a, mode='train')
    train_driver.reset(agent.init_policy)
    try:
        loop.run(
            train_driver, train_policy, cp, {'epstats': train_stats},
            {'replay': replay_train, 'replay_eval': replay_eval}, trainer,
            before=evaluate)
        loop.finish(cp, train_stats, trainer.metrics())
    finally:
        trainer.close()
        evaluation.close()
        train_driver.close()
        logger.close()


class Evaluation:
    """The eval side of `train_eval`: `args.eval_envs` envs (at least one)
    numbered after the train envs, acting in policy mode 'eval', whose data
    goes to `replay` and whose episodes to `eval_episode/` metrics, and the
    report on `replay`."""

    def __init__(self, agent, replay, make_env, make_stream, loop, logger,
                 args):
        self.agent = agent
        self.replay = replay
        self.logger = logger
        self.args = args
        self.stats = episodeslib.EpisodeStats(logger, 'eval_episode')
        envs = range(args.envs, args.envs + max(1, args.eval_envs))
        self.driver = loop.driver(
            make_env, envs, replay.add, self.stats.add, count=False)
        self.stream = iter(agent.stream(make_stream(replay, 'eval')))
        self.carry = agent.init_report(args.batch_size)

    def run_episodes(self):
        """Runs `args.eval_eps` episodes and logs their `eval_epstats/`."""
        self.driver.reset(self.agent.init_policy)
        policy = lambda *a: self.agent.policy(*a, mode='eval')
        self.driver(policy, episodes=self.args.eval_eps)
        self.logger.add(self.stats.result(), prefix='eval_epstats')

    def report(self):
        """Logs the agent's report on a batch of the eval replay."""
        if len(self.replay):
            self.carry, mets = reporting.report_on(
                self.agent, self.stream, self.args, self.carry)
            self.logger.add(mets, prefix='eval')

    def close(self):
        reporting.close_stream(self.stream)
        self.driver.close()
