"""The learner thread of the agent role (by default inside the launcher's
process): trains the shared agent.

    restore the agent (resume tag, or run.from_checkpoint); barrier.wait()
    wait until the agent has compiled train (it compiles in the background
    while the actor acts), then
    while not stopped:
        batch = next(train stream)          # replay 'sample_batch_train'
        carry, outs, metrics = agent.train(carry, batch)
        (previous update's outs and metrics, read now, after this update
         was dispatched:)
        replay.update(outs['replay'])       # replay context, if any
        every run.report_every: agent.report on 'sample_batch_report'
                                (and 'sample_batch_eval' with eval envs)
        every run.log_every: logger.add(train metrics)
                             (several replicas: exchange the replicas' env
                              steps, logger.replica_steps; also at the start
                              and at the end)

What several replicas agree on (going on, saves, eval reports, env steps)
is asked of `ReplicaSync` (learner_replicas.py) at the same points of the
loop; with one replica it answers as a lone learner decides.

Batches arrive through `batch_stream`s, prefetched; train batches through
shared memory when the replay is on this machine
(`rpc.replay_to_learner`). Saves come from the launcher through the agent's
control (`AgentControl.save`, on a server thread), under `link.train_lock`.

RPC methods called: replay `sample_batch_train`, `sample_batch_report`,
`sample_batch_eval`, `update`; logger `add` (several replicas:
`replica_steps`).
"""

import collections
import functools
import time

import elements
import psutil

import embodied
from embodied import rpc
from embodied.run import arguments
from embodied.run import reporting
from embodied.run import saving
from embodied.run.parallel import connections
from embodied.run.parallel.learner_replicas import ReplicaSync
from embodied.run.parallel.link import link_of
from embodied.run.reporting import prefix


@elements.timer.section('learner')
def parallel_learner(agent, barrier, args):
    """Trains on batches streamed from the replay until asked to stop."""
    args = arguments.normalize(args)
    link = link_of(barrier)
    should_log = embodied.GlobalClock(args.log_every)
    should_report = embodied.GlobalClock(args.report_every)
    stop = link.learner_stop

    cp, tag = saving.resume_role(args, 'agent', agent=agent)
    if tag is not None:
        print(f'Learner resumed the agent from the save at step {tag}.')
    replicas = ReplicaSync(args, link, tag)
    if args.from_checkpoint and not replicas.replicated:
        saving.load_agent(
            agent, args.from_checkpoint, args.from_checkpoint_regex,
            saving.trust_pickle(args))
    link.checkpoint = cp

    logger = connections.connect(
        args, 'logger', 'LearnerLogger', maxinflight=4)
    results = _Results(args, link, connections.connect(
        args, 'replay', 'LearnerReplayUpdater', maxinflight=8))
    link.barrier.wait()
    replicas.share_steps(logger)

    names = ('train', 'report', 'eval') if args.eval_envs else (
        'train', 'report')
    sources = {source: batch_stream(args, source, stop, link.count)
               for source in names}
    streams = {source: iter(agent.stream(embodied.streams.Stateless(
        sources[source]))) for source in names}
    pending = None  # The last update's (outs, metrics), read one update late.
    carry = None
    try:
        # The first step waits for train to compile (the agent compiles it
        # while the actor acts and the replay fills) or for a stop.
        if wait_compiled(agent, stop):
            carry = agent.init_train(args.batch_size)
        while True:
            with elements.timer.section('batch_next'):
                batch = None if stop.is_set() else next(
                    streams['train'], None)
            if not replicas.go_on(batch, stop):
                break
            start = time.monotonic()
            with elements.timer.section('train_step'), link.train_lock:
                carry, outs, mets = agent.train(carry, batch)
            link.count('train_seconds', time.monotonic() - start)
            link.count('train_steps')
            replicas.updated()
            if pending:
                results.read(*pending)
            pending = (outs, mets)
            results.fps.step(args.batch_size * args.batch_length)
            if should_report(skip=not sources['report'].ready_soon()):
                with elements.timer.section('report'):
                    _report(agent, args, link, streams, sources, replicas,
                            logger)
                link.count('reports')
            if should_log():
                logger.add(results.stats(agent, sources))
                replicas.share_steps(logger)
        if pending:
            results.read(*pending)
        replicas.finish(logger, agent)
        final = {**prefix(results.agg.result(), 'train'),
                 **policy_lag(agent, link)}
        if final:
            logger.add(final).result()
    finally:
        link.learner_done.set()
        for client in (logger, results.updater):
            client.close(1)
        for stream in streams.values():
            reporting.close_stream(stream)
        for stream in sources.values():
            stream.close()
    return 0


class _Results:
    """Reads each update's results one update late (so the device runs
    the next one meanwhile), sends its replay context back to the replay,
    and keeps the train metrics until they are logged."""

    def __init__(self, args, link, updater):
        self.args, self.link, self.updater = args, link, updater
        self.agg = elements.Agg()
        self.usage = elements.Usage(**args.usage)
        self.fps = elements.FPS()
        self.updates = collections.deque()
        self.finished = False

    def read(self, outs, mets):
        """Reads an update's results (waiting for the device if it is not
        done) and sends its replay context back."""
        start = time.monotonic()
        with elements.timer.section('train_results'):
            self.agg.add(mets)
        self.link.count('train_seconds', time.monotonic() - start)
        if not self.finished:
            launched = psutil.Process().create_time()
            print(f'First train step finished {time.time() - launched:.1f} '
                  f's after launch.', flush=True)
            self.finished = True
        if 'replay' in outs:
            with elements.timer.section('replay_update'):
                self.updates.append(self.updater.update(outs['replay']))
            while self.updates and self.updates[0].done():
                self.updates.popleft().result()

    def stats(self, agent, sources):
        """The metrics of one log: train rate and metrics, timers, policy
        lag, resource usage, and each batch stream's client."""
        stats = {'fps/train': self.fps.result()}
        stats.update(reporting.timer_metrics('timer/agent'))
        stats.update(prefix(self.agg.result(), 'train'))
        stats.update(policy_lag(agent, self.link))
        stats.update(prefix(self.usage.stats(), 'usage/agent'))
        for source, stream in sources.items():
            stats.update(prefix(stream.client.stats(), f'client/{source}'))
        return stats


def _report(agent, args, link, streams, sources, replicas, logger):
    """A report on a fresh carry, as the original, and with eval envs an
    eval report once every replica's eval batch is ready."""
    for source in ('report', 'eval'):
        if source == 'eval' and not (args.eval_envs and replicas.eval_ready(
                sources['eval'].ready_soon())):
            continue
        carry = agent.init_report(args.batch_size)
        _, metrics = reporting.report_on(
            agent, streams[source], args, carry, link.train_lock)
        if metrics is not None:
            logger.add(prefix(metrics, source))


def policy_lag(agent, link=None):
    """The policy lag metrics, in updates: of the policy in this process
    (agents that swap parameters to the policy), or of the policy process
    that `link.publisher` feeds; else none."""
    lags = agent.policy_lag() if hasattr(agent, 'policy_lag') else {}
    publisher = link and link.publisher
    if publisher is not None:
        lags = {**lags, **publisher.lags()}
    return lags


def wait_compiled(agent, stop, poll=0.2):
    """Waits until the agent's train is compiled (`wait_compiled`, agents
    that compile in the background); False when `stop` is set first."""
    wait = getattr(agent, 'wait_compiled', None)
    if wait is None:
        return not stop.is_set()
    while not wait(poll):
        if stop.is_set():
            return False
    return True


def batch_stream(args, source, stop, count, prefetch=4):
    """The replay's `sample_batch_<source>` batches (`rpc.replay_to_learner`),
    `prefetch` requests ahead; train batches through shared memory with
    run.shared_batches. Ends when `stop` is set or the replay shuts down.
    `count(key, amount)` adds to the learner's counters (`AgentLink.count`)."""
    client = connections.connect(
        args, 'replay', f'LearnerReplay{source.title()}')
    consumer = rpc.replay_to_learner.Consumer(
        functools.partial(client.call, f'sample_batch_{source}'),
        f'Learner: {source} batches', source == 'train' and
        args.shared_batches, prefetch,
        on_shared=functools.partial(count, f'{source}_shared_batches'),
        peer=args.replay_addr)

    def wait(future):
        start = time.monotonic()
        with elements.timer.section(f'stream_{source}_response'):
            data = rpc.result(
                future, stop, report_every=args.wait_report, report=lambda: (
                    f'Learner: waiting for a {source} batch from the replay '
                    f'at {args.replay_addr} ({stream.received} received so '
                    f'far; the replay reports its limiter and fill state '
                    f'while it waits)'))
        count(f'{source}_wait_seconds', time.monotonic() - start)
        return data

    stream = rpc.replay_to_learner.BatchStream(consumer, wait, client)
    return stream
