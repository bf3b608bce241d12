"""What the learners of a run's replicas agree on, in one place: whether to
go on, when to save, when to evaluate, and the env steps they share.

The learner asks `ReplicaSync` at the same points of its loop whether it
runs alone or as one of several replicas. With one replica every answer is
what a lone learner decides for itself, as in the original: go on until
stopped, no saves of its own (the launcher saves), evaluate when a batch is
ready. With several, each decision is a global clock (`embodied.
GlobalClock`), whose n-th call waits for the n-th call of every replica, so
all learners take the same number of updates and leave the loop at the same
call; saves are tagged by the run's update count, which every replica
shares from the resumed tag on, and the launcher's poll of the agent's
status (`learner_save_request`, `learner_replica_stop`) turns them into save
and stop RPCs.

Global clocks must be made in the same order on every replica:
`ReplicaSync` makes its own after the learner's log and report clocks.
"""

import embodied
from embodied.run import saving


class ReplicaSync:
    """The learner's decisions that replicas share; `link` is the agent's
    `AgentLink`, `tag` the save the learner resumed from (or None)."""

    def __init__(self, args, link, tag):
        self.replicated = int(args.get('replicas', 1)) > 1
        self.replica = args.get('replica', 0)
        self.link = link
        self._go_on = embodied.GlobalClock(-1)
        self._eval_ready = embodied.GlobalClock(-1)
        self._should_save = (
            embodied.GlobalClock(args.save_every) if self.replicated else None)
        if self.replicated:
            link.count('run_tag', int(tag or 0))

    def share_steps(self, logger):
        """Several replicas: every replica's env step, exchanged among the
        learners (they log in lockstep), goes to this replica's logger,
        which counts the run's step as the sum. Called at the start, at
        each log and at the end, on every replica alike."""
        if not self.replicated:
            return
        from embodied.jax import distributed
        own = int(logger.replica_steps(None).result())
        logger.replica_steps(distributed.exchange('env_steps', own)).result()

    def go_on(self, batch, stop):
        """Whether to take the next update with `batch` (None: the stream
        ended); False for every replica once one of them has no batch or
        was asked to stop."""
        if self._go_on(skip=batch is None or stop.is_set()):
            return True
        if self.replicated and batch is not None and not stop.is_set():
            print('Learner: another replica stopped the run.', flush=True)
            self.link.count('replica_stop')
            stop.set()
        return False

    def updated(self):
        """After each update: several replicas count the run's updates and
        ask the launcher to save under that count when their clock says."""
        if not self.replicated:
            return
        self.link.count('run_tag')
        if self._should_save():
            self.link.record(
                'save_request', self.link.learner_stats()['run_tag'])

    def eval_ready(self, ready):
        """Whether to evaluate now: this learner's eval batch is `ready`
        (every replica's, with several)."""
        return self._eval_ready(skip=not ready)

    def finish(self, logger, agent):
        """After the loop, on every replica at the same call: the last
        exchange of env steps, and the digest of the parameters, which
        must be the same on every replica."""
        if not self.replicated:
            return
        self.share_steps(logger)
        with self.link.train_lock:
            print(f'Replica {self.replica}: parameter digest '
                  f'{saving.digest(agent.save())} after '
                  f'{self.link.learner_stats().get("train_steps", 0)} '
                  f'updates.', flush=True)
