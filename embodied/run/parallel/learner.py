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
from embodied.run import learning
from embodied.run import saving
from embodied.run import connections
from embodied.run.parallel.link import link_of
from embodied.run.learning import prefix


def share_env_steps(logger):
    """With several replicas: every replica's env step, exchanged among the
    learners (they log in lockstep), goes to this replica's logger, which
    counts the run's step as the sum."""
    from embodied.jax import distributed
    own = int(logger.replica_steps(None).result())
    logger.replica_steps(distributed.exchange('env_steps', own)).result()


@elements.timer.section('learner')
def parallel_learner(agent, barrier, args):
    """Trains on batches streamed from the replay until asked to stop."""
    args = arguments.normalize(args)
    link = link_of(barrier)
    agg = elements.Agg()
    usage = elements.Usage(**args.usage)
    should_log = embodied.GlobalClock(args.log_every)
    should_report = embodied.GlobalClock(args.report_every)
    fps = elements.FPS()
    batch_steps = args.batch_size * args.batch_length
    stop = link.learner_stop

    cp, tag = saving.resume_role(args, 'agent', agent=agent)
    if tag is not None:
        print(f'Learner resumed the agent from the save at step {tag}.')
    # With several replicas the learners agree (global clocks) on stopping,
    # eval reports and saves; saves are tagged by the run's update count
    # from the resumed tag on, which every replica shares.
    replicated = int(args.get('replicas', 1)) > 1
    go_on = embodied.GlobalClock(-1)
    eval_ready = embodied.GlobalClock(-1)
    should_save = embodied.GlobalClock(args.save_every) if replicated else None
    if replicated:
        link.count('run_tag', int(tag or 0))
    elif args.from_checkpoint:
        saving.load_agent(
            agent, args.from_checkpoint, args.from_checkpoint_regex)
    link.checkpoint = cp

    logger = connections.connect(
        args, 'logger', 'LearnerLogger', maxinflight=4)
    updater = connections.connect(
        args, 'replay', 'LearnerReplayUpdater', maxinflight=8)
    link.barrier.wait()
    if replicated:
        share_env_steps(logger)

    names = ('train', 'report', 'eval') if args.eval_envs else (
        'train', 'report')
    sources = {source: batch_stream(args, source, stop, link.count)
               for source in names}

    def evaluate(stream):
        carry = agent.init_report(args.batch_size)  # Fresh, as the original.
        _, metrics = learning.report_on(
            agent, stream, args, carry, link.train_lock)
        return metrics

    def make_stream(source):
        stream = embodied.streams.Stateless(sources[source])
        return iter(agent.stream(stream))

    stream_train = make_stream('train')
    stream_report = make_stream('report')
    stream_eval = make_stream('eval') if args.eval_envs else None
    updates = collections.deque()
    pending = None  # The last update's (outs, metrics), read one update late.
    finished = []  # Not empty once an update's results were read.
    carry = None

    def finish_update(outs, mets):
        """Reads an update's results (waiting for the device if it is not
        done) and sends its replay context back."""
        start = time.monotonic()
        with elements.timer.section('train_results'):
            agg.add(mets)
        link.count('train_seconds', time.monotonic() - start)
        if not finished:
            launched = psutil.Process().create_time()
            print(f'First train step finished {time.time() - launched:.1f} '
                  f's after launch.', flush=True)
            finished.append(True)
        if 'replay' in outs:
            with elements.timer.section('replay_update'):
                updates.append(updater.update(outs['replay']))
            while updates and updates[0].done():
                updates.popleft().result()

    def policy_lag():
        return agent.policy_lag() if hasattr(agent, 'policy_lag') else {}

    try:
        # The first step waits for train to compile (the agent compiles it
        # while the actor acts and the replay fills) or for a stop.
        if wait_compiled(agent, stop):
            carry = agent.init_train(args.batch_size)
        while True:
            with elements.timer.section('batch_next'):
                batch = None if stop.is_set() else next(stream_train, None)
            if not go_on(skip=batch is None or stop.is_set()):
                if replicated and batch is not None and not stop.is_set():
                    print('Learner: another replica stopped the run.',
                          flush=True)
                    link.count('replica_stop')
                    stop.set()
                break
            start = time.monotonic()
            with elements.timer.section('train_step'), link.train_lock:
                carry, outs, mets = agent.train(carry, batch)
            link.count('train_seconds', time.monotonic() - start)
            link.count('train_steps')
            if replicated:
                link.count('run_tag')
                if should_save():
                    tag = link.learner_stats()['run_tag']
                    with link.learner_lock:
                        link.learner['save_request'] = tag
            if pending:
                finish_update(*pending)
            pending = (outs, mets)
            fps.step(batch_steps)

            if should_report(skip=not sources['report'].ready_soon()):
                with elements.timer.section('report'):
                    metrics = evaluate(stream_report)
                    if metrics is not None:
                        logger.add(prefix(metrics, 'report'))
                    if args.eval_envs and eval_ready(
                            skip=not sources['eval'].ready_soon()):
                        metrics = evaluate(stream_eval)
                        if metrics is not None:
                            logger.add(prefix(metrics, 'eval'))
                link.count('reports')

            if should_log():
                stats = {}
                stats['fps/train'] = fps.result()
                stats.update(learning.timer_metrics('timer/agent'))
                stats.update(prefix(agg.result(), 'train'))
                stats.update(policy_lag())
                stats.update(prefix(usage.stats(), 'usage/agent'))
                for source, stream in sources.items():
                    stats.update(prefix(
                        stream.client.stats(), f'client/{source}'))
                logger.add(stats)
                if replicated:
                    share_env_steps(logger)
        if pending:
            finish_update(*pending)
        if replicated:
            share_env_steps(logger)  # All left the loop at the same call.
            with link.train_lock:
                print(f'Replica {args.replica}: parameter digest '
                      f'{saving.digest(agent.save())} after '
                      f'{link.learner_stats().get("train_steps", 0)} '
                      f'updates.', flush=True)
        final = {**prefix(agg.result(), 'train'), **policy_lag()}
        if final:
            logger.add(final).result()
    finally:
        link.learner_done.set()
        for client in (logger, updater):
            client.close(1)
        for stream in (stream_train, stream_report, stream_eval):
            learning.close_stream(stream)
        for stream in sources.values():
            stream.close()
    return 0


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
