"""What the single-process scripts (train, train_eval, eval_only) share:
the step and its clocks, env drivers, metrics, the stop rule, the end."""

import os
import time
from functools import partial as bind

import elements

import embodied
from embodied.core import broken_streams
from embodied.run import progress
from embodied.run import reporting
from embodied.run import saving
from embodied.run import stopping


class Loop:
    """The state around a single-process run's loop.

        loop = Loop(args, logger)
        driver = loop.driver(make_env, range(args.envs), replay.add, ...)
        cp = restore(args, agent, logger, replay=replay)
        loop.begin('Start training loop')
        loop.run(driver, policy, cp, {'epstats': stats}, {'replay': replay})
        loop.finish(cp, stats)
    """

    def __init__(self, args, logger):
        self.args = args
        self.logger = logger
        self.step = logger.step
        self.usage = elements.Usage(**args.usage)
        self.policy_fps = elements.FPS()
        # Global clocks: with several replicas every one logs, saves and
        # stops at the same round of env steps (their calls into the
        # agent are collectives); with one, they are local clocks.
        self.should_log = embodied.GlobalClock(args.log_every)
        self.should_save = embodied.GlobalClock(args.save_every)
        self.go_on = embodied.GlobalClock(-1)  # False once any replica stops.
        # The run's env step counts every replica's steps; the replicas
        # step alike, so it is this replica's step times their number.
        self.replicas = max(1, int(args.get('replicas', 1)))
        self.start = None
        self.eta = None
        # Held from the loop through the final save, so that a repeated
        # SIGTERM (schedulers send it again) cannot end the final save. A
        # stdout that lost its reader stops the run too; the output goes on
        # in the logdir.
        if args.get('logdir'):
            broken_streams.set_fallback(
                os.path.join(args.logdir, broken_streams.FILENAME))
        self.stop = stopping.StopSignal(watch_output=True)

    def driver(self, make_env, envids, *on_step, count=True):
        """A driver of the envs `make_env(envid)`; each step goes to
        `on_step` and, with `count`, increments the step."""
        fns = [bind(make_env, i) for i in envids]
        driver = embodied.Driver(fns, parallel=not self.args.debug)
        if count:
            driver.on_step(lambda tran, _: self.step.increment())
        driver.on_step(lambda tran, _: self.policy_fps.step())
        for fn in on_step:
            driver.on_step(fn)
        return driver

    def begin(self, message):
        print(message)
        self.start = time.monotonic()
        self.eta = progress.Eta(
            self.args.steps, self.args.duration, self.run_step())

    def run(self, driver, policy, cp, episodes, replays=None, trainer=None,
            before=None):
        """Steps `driver` with `policy` until a stop signal or a limit,
        writing metrics and saving `cp` on their clocks; `before()` runs
        before each round of env steps."""
        with self.stop as signal:
            while not self.should_stop(signal):
                if before:
                    before()
                driver(policy, steps=10)
                if self.should_log(self.step):
                    self.write_metrics(episodes, replays, trainer)
                if self.should_save(self.step):
                    cp.save(int(self.step))

    def run_step(self):
        """The run's env step: over all replicas."""
        return int(self.step) * self.replicas

    def should_stop(self, signal):
        """True on a stop signal, at run.steps or after run.duration
        (`stopping.stop_reason`), saying which limit was reached; with
        several replicas, True on all of them once it is on any."""
        reason = stopping.stop_reason(
            self.args, self.run_step(), self.start, signal)
        if reason and not signal.requested:
            print(f'{reason} at step {self.run_step()}.')
        if not self.go_on(skip=reason is not None):
            if reason is None:
                print(f'Another replica stopped the run at step '
                      f'{self.run_step()}.', flush=True)
            return True
        return False

    def write_metrics(self, episodes, replays=None, trainer=None):
        """Prints progress and writes the periodic metrics: `episodes` maps
        prefixes to EpisodeStats, `replays` prefixes to replays."""
        print(f'[Progress] {self.eta.line(self.run_step())}', flush=True)
        logger = self.logger
        if trainer:
            logger.add(trainer.metrics())
        for prefix, stats in episodes.items():
            logger.add(stats.result(), prefix=prefix)
        for prefix, replay in (replays or {}).items():
            logger.add(replay.stats(), prefix=prefix)
        logger.add(self.usage.stats(), prefix='usage')
        logger.add({'fps/policy': self.policy_fps.result()})
        logger.add(reporting.timer_metrics('timer'))
        logger.write()

    def finish(self, cp, stats, metrics=None):
        """The final save, metrics and summary line."""
        with self.stop:
            cp.save(int(self.step))
            if self.replicas > 1:
                agent = getattr(cp['agent'], 'agent', None)
                if agent is not None:
                    print(f'Replica {self.args.replica}: parameter digest '
                          f'{saving.digest(agent.save())} after the final '
                          f'save.', flush=True)
            if metrics:
                self.logger.add(metrics)
            self.logger.write()
        summary = self.eta.summary(self.run_step(), stats.recent_score())
        print(f'[Summary] {summary}', flush=True)


def restore(args, agent, logger, **replays):
    """The run's checkpoint of `agent`, the `replays` (by name) and the
    `logger`'s step: resumed from `args.logdir`, or, with nothing to resume,
    the agent from `run.from_checkpoint`. Metrics the logger's outputs hold
    for steps after the resumed one are moved aside."""
    step = logger.step
    cp = saving.RunCheckpoint(args)
    cp['agent'].agent = agent
    for name, replay in replays.items():
        if hasattr(replay, 'save_wait'):
            # A save must not outrun its chunk files (a full disk would
            # leave a complete-looking save without them).
            replay.save_wait = True
        setattr(cp['replay'], name, replay)
    cp['logger'].step = step
    if args.from_checkpoint and saving.resume_tag(
            args.logdir, report=False,
            replica=saving.replica_of(args)) is None:
        saving.load_agent(
            agent, args.from_checkpoint, args.from_checkpoint_regex,
            saving.trust_pickle(args))
    tag = cp.load_or_save(0)
    if tag is not None:
        print(f'Resumed from the save at step {tag}.')
    saving.rewind_outputs(logger, tag)
    return cp
