"""The logger process: counts the global step and writes metrics.

    LoggerRole, one method per RPC method:
    tran(transitions)   step += train rows; episode statistics per env
    add(metrics)        from the learner and the replay
    abandon(envids)     drops the unfinished episodes of a crashed worker
    replica_steps(steps) every replica's env step (several replicas): the
                        step written is their sum; returns this replica's
    status, quiesce, save(tag), resume, stop(stage): the control protocol
                        (control.py)
    every run.log_every: write aggregated metrics (jsonl, terminal, ...)

The step (train env steps) is what the launcher reads (`status`) to decide
`run.steps` and to tag every save. RPC methods served: `LoggerRole.RPC`.
"""

import collections
import threading
import time

import elements
import numpy as np

import embodied
from embodied.run import arguments
from embodied.run import episodes as episodeslib
from embodied.run import saving
from embodied.run.parallel import roles
from embodied.run.parallel import connections
from embodied.run.parallel import control


class LoggerRole(control.RoleControl):
    """The logger process's logic; each RPC method is a method of the same
    name. Owns the global step (`logger.step`) and the episode statistics.
    Methods run on the server's threads; everything they touch is under
    `lock`. `checkpoint` must be set before `save` is called, and `on_exit`
    (what ends the process) before `stop('exit')`, its one stop stage.
    Nothing to quiesce: transitions in flight are the actor's."""

    ROLE = 'logger'
    STAGES = roles.stage_names(ROLE)
    RPC = {  # Its RPC methods: who calls each.
        'tran': 'actor', 'add': 'learner, replay, env workers (worker 0)',
        'replica_steps': 'learner (several replicas)',
        'abandon': connections.LAUNCHER, **control.RoleControl.RPC}

    def __init__(self, logger, args):
        self.logger = logger
        self.step = logger.step
        # The step written: with several replicas, the run's (`RunStep`).
        self.run_step = self.step
        if int(args.get('replicas', 1)) > 1:
            self.run_step = logger.step = RunStep(
                self.step, int(args.replica), int(args.replicas))
        self.episode_timeout = args.episode_timeout
        self.checkpoint = None
        self.on_exit = None
        self.lock = threading.Lock()
        # One env of each kind gives the episode videos: env 0, and the
        # first eval env (env ids count the train envs first).
        self.episodes = {
            False: episodeslib.EpisodeStats(logger, 'episode'),
            True: episodeslib.EpisodeStats(
                logger, 'eval_episode', video_worker=int(args.envs))}
        self.parallel = elements.Agg()
        self.updated = {}  # envid: (time of its last step, is_eval)
        self.counts = collections.Counter()

    # RPC methods.

    def add(self, metrics):
        """Metrics to write with the next `write`."""
        with self.lock:
            self.logger.add(metrics)
            self.counts['adds'] += 1

    def tran(self, trans):
        """Steps of several envs: train rows count toward the step; every
        row goes to its env's episode statistics."""
        now = time.monotonic()
        envids = trans.pop('envid').tolist()
        is_eval = trans['is_eval']
        trans.pop('is_eval')
        evals = is_eval.tolist()
        with self.lock:
            self.step.increment(evals.count(False))
            self.counts['env_steps'] += len(envids)
            # Summed here, added to `parallel` once per write.
            self.counts['ep_starts'] += int(trans['is_first'].sum())
            self.counts['ep_ends'] += int(trans['is_last'].sum())
            for envid, evaluating in zip(envids, evals):
                self.updated[envid] = (now, evaluating)
            kinds = set(evals)
            for evaluating in kinds:
                if len(kinds) == 1:
                    rows, part = envids, trans
                else:
                    index = np.flatnonzero(is_eval == evaluating)
                    rows = [envids[i] for i in index]
                    part = {k: v[index] for k, v in trans.items()}
                self.episodes[evaluating].add_batch(part, rows)

    def abandon(self, envids):
        """Drops the unfinished episodes of envs whose worker crashed."""
        with self.lock:
            for envid in (int(x) for x in envids):
                self.parallel.add('env_crashes', 1, agg='sum')
                self.counts['adds'] += 1
                self.updated.pop(envid, None)
                for stats in self.episodes.values():
                    if envid in stats.episodes:
                        stats.drop(envid)
                        self.parallel.add('ep_abandoned', 1, agg='sum')

    def status(self):
        with self.lock:  # `tran` adds scores meanwhile.
            score = self.episodes[False].recent_score()
            run_step = int(self.run_step)
        return {'step': int(self.step), 'run_step': run_step,
                'env_steps': self.counts['env_steps'], 'score': score}

    def replica_steps(self, steps=None):
        """Records every replica's env step (a list by replica, as the
        learners exchanged them; the run's step counts the other replicas'
        from now on) and returns this replica's own step. With None, only
        returns it."""
        with self.lock:
            if steps is not None:
                self.run_step.update(steps)
            return int(self.step)

    def save(self, tag):
        with self.lock:
            self.checkpoint.save(int(tag))
        return int(tag)

    def _stop_exit(self):
        self.on_exit()

    # For the process.

    def write(self, extra=None):
        """Writes what arrived since the last write, with `extra()`'s
        metrics (prefixed `server/logger`); nothing when nothing arrived."""
        with self.lock:
            self._drop_stale()
            counts = self.counts
            if not counts['adds'] and counts['env_steps'] == counts['written']:
                return  # Nothing new: avoid empty writes.
            counts['adds'] = 0
            counts['written'] = counts['env_steps']
            logger = self.logger
            for key in ('ep_starts', 'ep_ends'):
                if key in counts:
                    self.parallel.add(key, counts.pop(key), agg='sum')
            logger.add(self.parallel.result(), prefix='parallel')
            logger.add(self.episodes[False].result(), prefix='epstats')
            logger.add(self.episodes[True].result(), prefix='eval_epstats')
            if extra:
                logger.add(extra(), prefix='server/logger')
            logger.write()

    def _drop_stale(self):
        """Drops the episodes of envs silent for run.episode_timeout (called
        with the periodic write, not per request)."""
        now = time.monotonic()
        for envid, (last, evaluating) in list(self.updated.items()):
            if now - last >= self.episode_timeout:
                print(f'Dropping the episode of env {envid}: no step '
                      f'for {self.episode_timeout} s.', flush=True)
                self.episodes[evaluating].drop(envid)
                del self.updated[envid]


class RunStep:
    """The run's env step with several replicas: this replica's own step
    (`own`, live) plus the other replicas' steps as their learners last
    exchanged them (`update`); before the first exchange, the own step
    times the replicas. Stands for the logger's step."""

    def __init__(self, own, replica, replicas):
        self.own, self.replica, self.replicas = own, replica, replicas
        self.others = None

    def update(self, steps):
        if len(steps) != self.replicas:
            raise ValueError(
                f'Expected the env steps of {self.replicas} replicas, got '
                f'{len(steps)}.')
        self.others = sum(
            int(s) for i, s in enumerate(steps) if i != self.replica)

    def __int__(self):
        own = int(self.own)
        return own * self.replicas if self.others is None else (
            own + self.others)

    def __repr__(self):
        return f'RunStep({int(self)})'


# The process: the role behind a server on run.logger_addr.

@elements.timer.section('logger')
def parallel_logger(make_logger, args):
    """Counts the global step (train env steps), aggregates episodes and
    writes metrics."""
    args = arguments.normalize(args)
    logger = connections.loads(make_logger)()
    role = LoggerRole(logger, args)
    role.checkpoint, tag = saving.resume_role(args, 'logger', step=role.step)
    if tag is not None:
        print(f'Logger resumed at step {int(role.step)}.', flush=True)
    # The restored step (a save's tag is the step, except with several
    # replicas, where it counts updates).
    saving.rewind_outputs(
        logger, None if tag is None else int(role.run_step))

    done = threading.Event()
    server = connections.server(args, 'logger', 'Logger')
    role.on_exit = done.set
    connections.bind_role(server, role)
    server.start()
    should_log = embodied.LocalClock(args.log_every)
    try:
        while not done.wait(0.5):
            server.raise_error()
            if should_log():
                role.write(server.stats)
        role.write(server.stats)
    finally:
        server.close()
        logger.close()
    return 0
