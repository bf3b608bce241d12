"""The parallel runner: agent, replay, logger and envs in separate workers.

    env workers ──act(obs)──► agent: actor thread ──add_batch──► replay
               ◄──actions───         (batches envs)  ──tran─────► logger
                                    learner thread ◄─sample_batch_*─ replay
                                                   ──update───────►
                                                   ──add(metrics)─► logger
    launcher (`combined`): starts the workers, decides stop and save, prints
    progress.

Entry points keep the original's signatures: `combined`, `parallel_agent`,
`parallel_actor`, `parallel_learner`, `parallel_replay`, `parallel_logger`,
`parallel_env`, `parallel_envs`. Every factory may be given as a callable or
as its cloudpickled bytes.

Stop and save protocol. The launcher alone decides: at `run.steps` (the
logger's step, counting train env steps), after `run.duration` seconds, or on
SIGTERM/SIGINT; and every `run.save_every` seconds it saves. A save pauses the
actor and waits until every transition it produced is in the replay and the
logger (the learner keeps training meanwhile, so limiter waits drain), reads
the logger's step, and has the agent, replay (with limiter) and logger save
under that step as their checkpoint tag, then resumes the actor. A stop does
the same, then stops the learner, releases limiter waits, saves, answers every
env's next request with a stop reply (envs exit 0, remote ones too), and
shuts the roles down; every worker exits 0 and `combined` returns. On start,
each role loads the newest tag that all three checkpoints hold completely.

Faults. A crashed env worker is restarted (`envpool`, `run.env_restarts`);
the logger drops its unfinished episodes (`parallel/ep_abandoned`). An env
error a restart cannot fix (constructor, bad observation or action) stops
the run in order with a save, then `combined` raises `rpc.WorkerFailed`
naming the worker and its error. When the agent, replay or logger dies, the
others save under the last step and everything is killed. After each save
the replay deletes chunk files no kept save needs (`replay_files`).

Env workers live in `env_workers`, shared helpers in `wiring`, the progress
lines in `progress`.
"""

import collections
import threading
import time

import elements
import numpy as np

import embodied
from embodied import rpc
from embodied.core import checkpoint as cplib
from embodied.core import limiters
from embodied.run import env_workers
from embodied.run import envpool
from embodied.run import episodes as episodeslib
from embodied.run import progress
from embodied.run import remote_stream
from embodied.run import replay_files
from embodied.run import saving
from embodied.run import stopping
from embodied.run import timing
from embodied.run import wiring

ADDR_KEYS = ('actor_addr', 'replay_addr', 'logger_addr')

STOP_DRAIN = 3              # seconds a stop waits for transitions in flight
PORT_ATTEMPTS = 3

prefix = lambda d, p: {f'{p}/{k}': v for k, v in d.items()}


def combined(
        make_agent, make_replay_train, make_replay_eval, make_env_train,
        make_env_eval, make_stream, make_logger, args):
    """Runs the whole training launch until it stops; see the module doc."""
    args = wiring.complete(args)
    if args.actor_batch <= 0:
        args = args.update(actor_batch=max(1, args.envs // 2))
    if args.actor_batch > args.envs:
        raise ValueError(
            f'run.actor_batch ({args.actor_batch}) cannot exceed run.envs '
            f'({args.envs}): a policy batch would never fill.')
    factories = dict(
        agent=make_agent, replay_train=make_replay_train,
        replay_eval=make_replay_eval, env_train=make_env_train,
        env_eval=make_env_eval, stream=make_stream, logger=make_logger)
    factories = {k: wiring.dumps(v) for k, v in factories.items()}
    if args.get('from_checkpoint') and resume_tag(args.logdir) is None:
        saving.agent_save_folder(args.from_checkpoint)
    auto = any('{auto}' in str(args[k]) for k in ADDR_KEYS)
    for attempt in range(PORT_ATTEMPTS):
        filled = rpc.addresses.fill_auto(
            {k: args[k] for k in ADDR_KEYS}, wiring.ipv6(args))
        launch = _Launch(factories, args.update(filled))
        try:
            return launch.run()
        except rpc.WorkerFailed as e:
            if not auto or e.exitcode != rpc.supervisor.EXIT_PORT_TAKEN:
                raise
            if attempt + 1 == PORT_ATTEMPTS:
                raise
            print(f'{e} Retrying with other ports.', flush=True)


def parallel_agent(make_agent, args):
    """One agent shared by the actor and learner threads."""
    args = wiring.complete(args)
    agent = wiring.loads(make_agent)()
    link = _AgentLink()
    actor = rpc.Thread(parallel_actor, agent, link, args, name='Actor')
    learner = rpc.Thread(parallel_learner, agent, link, args, name='Learner')
    actor.start()
    learner.start()
    while actor.exitcode is None or learner.exitcode is None:
        for thread in (actor, learner):
            if thread.exitcode not in (None, 0):
                link.abort()
                if thread.exitcode == rpc.supervisor.EXIT_PORT_TAKEN:
                    return thread.exitcode  # The launcher retries.
                raise _ThreadFailed(
                    f'The {thread.name.lower()} thread failed: '
                    f'{thread.error or f"exit code {thread.exitcode}"}',
                    thread.exitcode)
        if learner.exitcode == 0 and not link.learner_stop.is_set():
            return 1  # The learner must only end when asked to.
        time.sleep(0.05)
    return 0


class _ThreadFailed(RuntimeError):
    """A thread of the agent failed; its exit code becomes the agent's."""

    def __init__(self, message, exitcode):
        super().__init__(message)
        self.exitcode = exitcode


class _AgentLink(threading.Barrier):
    """The barrier between actor and learner, plus what they share: the lock
    that keeps saves out of train steps, the learner's stop event and its
    progress counters."""

    def __init__(self):
        super().__init__(2)
        self.train_lock = threading.Lock()
        self.learner_stop = threading.Event()
        self.learner_done = threading.Event()
        self.checkpoint = None
        self.learner = collections.Counter()


def _link(barrier):
    return barrier if isinstance(barrier, _AgentLink) else _AgentLink()


# Actor


@elements.timer.section('actor')
def parallel_actor(agent, barrier, args):
    """Serves `act`: batches envs, runs the policy, replies, then sends the
    transitions to the replay and logger."""
    args = wiring.complete(args)
    link = _link(barrier)
    islist = lambda x: isinstance(x, list)
    initial = agent.init_policy(args.actor_batch)
    initial = elements.tree.map(lambda x: x[0], initial, isleaf=islist)
    carries = collections.defaultdict(lambda: initial)
    barrier.wait()  # Do not collect data before the learner restored.

    backlog = 8 * args.actor_threads
    replay = wiring.connect(args, 'replay', 'ActorReplay', maxinflight=backlog)
    logger = wiring.connect(args, 'logger', 'ActorLogger', maxinflight=backlog)
    inflight = collections.deque()  # Futures of sent transitions.
    inflight_lock = threading.Lock()
    counts = collections.Counter()
    done = threading.Event()

    def settle():
        """Forgets sent transitions that arrived; True when none is left."""
        with inflight_lock:
            while inflight and inflight[0].done():
                inflight.popleft().result()  # Raises what the role raised.
            return not inflight

    @elements.timer.section('workfn')
    def workfn(obs):
        start = time.monotonic()
        envid = obs.pop('envid')
        is_eval = obs.pop('is_eval')
        carry = [carries[e] for e in envid.tolist()]
        carry = elements.tree.map(lambda *xs: list(xs), *carry)
        logs = {k: v for k, v in obs.items() if k.startswith('log/')}
        obs = {k: v for k, v in obs.items() if not k.startswith('log/')}
        carry, acts, outs = agent.policy(carry, obs)
        clash = set(acts) & set(outs)
        assert not clash, f'policy outs repeat action keys: {sorted(clash)}'
        for i, e in enumerate(envid.tolist()):
            carries[e] = elements.tree.map(lambda x: x[i], carry, isleaf=islist)
        acts = {k: np.asarray(v) for k, v in acts.items()}
        outs = {k: np.asarray(v) for k, v in outs.items()}
        trans = {'envid': envid, 'is_eval': is_eval, **obs, **acts, **outs,
                 **logs}
        for value in trans.values():
            if value.flags.writeable and value.flags.owndata:
                value.setflags(write=False)
        reply = {**acts, 'reset': np.asarray(obs['is_last'], bool)}
        counts['policy_steps'] += len(envid)
        counts['policy_seconds'] += time.monotonic() - start
        return reply, trans

    def wait_for_room():
        """Back-pressure: waits while `backlog` sends are in flight, as the
        clients' maxinflight would, but gives up at shutdown (a client call
        blocked on a dead role would keep the process from exiting)."""
        while True:
            with inflight_lock:
                oldest = inflight[0] if len(inflight) >= backlog else None
            if oldest is None:
                return
            if done.is_set():
                raise RuntimeError('The actor shut down with transitions '
                                   'still waiting for the replay or logger.')
            oldest.wait(0.1)
            settle()

    @elements.timer.section('postfn')
    def postfn(trans):
        logs = {k: v for k, v in trans.items() if k.startswith('log/')}
        data = {k: v for k, v in trans.items() if not k.startswith('log/')}
        wait_for_room()
        futures = (replay.add_batch(data), logger.tran({**data, **logs}))
        with inflight_lock:
            inflight.extend(futures)
        settle()

    def drained():
        return server.idle('act') and settle()

    def status():
        server_stats = server.stats()
        return {
            **{k: int(v) if isinstance(v, int) else float(v)
               for k, v in counts.items()},
            **{f'learner_{k}': v for k, v in link.learner.items()},
            **prefix(server_stats, 'server'),
            'carries': len(carries),
        }

    def save(tag):
        with link.train_lock:
            link.checkpoint.save(int(tag))
        return int(tag)

    def stop_learner():
        link.learner_stop.set()
        link.learner_done.wait(args.connect_timeout)
        return link.learner_done.is_set()

    server = rpc.Server(
        args.actor_addr, 'Actor', flush_after=args.actor_flush,
        ipv6=wiring.ipv6(args))
    server.bind(
        'act', workfn, postfn, batch=args.actor_batch,
        workers=args.actor_threads)
    server.bind('status', status)
    server.bind('pause', lambda: server.pause('act'))
    server.bind('resume', lambda: server.resume('act'))
    server.bind('drained', drained)
    server.bind('save', save)
    server.bind('stop_learner', stop_learner)
    server.bind('stop_envs', lambda: server.answer(
        'act', {wiring.STOP_KEY: True}))
    server.bind('shutdown', done.set)
    server.start()
    try:
        while not done.wait(0.2):
            server.raise_error()
        _wait_envs_gone(server)
    finally:
        server.close()
        replay.close(1)
        logger.close(1)
    return 0


def _wait_envs_gone(server, timeout=5):
    """Gives env workers time to receive their stop reply and hang up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(server.connections) <= 1:  # The launcher's control client.
            return
        time.sleep(0.05)


# Learner


@elements.timer.section('learner')
def parallel_learner(agent, barrier, args):
    """Trains on batches streamed from the replay until asked to stop."""
    args = wiring.complete(args)
    link = _link(barrier)
    agg = elements.Agg()
    usage = elements.Usage(**args.usage)
    should_log = embodied.GlobalClock(args.log_every)
    should_report = embodied.GlobalClock(args.report_every)
    fps = elements.FPS()
    batch_steps = args.batch_size * args.batch_length
    stop = link.learner_stop

    cp = cplib.Checkpoint(saving.directory(args.logdir, 'agent'),
                          args.save_keep)
    cp.agent = agent
    tag = resume_tag(args.logdir)
    if tag is not None:
        cp.load(tag)
        print(f'Learner resumed the agent from the save at step {tag}.')
    elif args.from_checkpoint:
        saving.load_agent(
            agent, args.from_checkpoint, args.from_checkpoint_regex)
    link.checkpoint = cp

    logger = wiring.connect(args, 'logger', 'LearnerLogger', maxinflight=4)
    updater = wiring.connect(
        args, 'replay', 'LearnerReplayUpdater', maxinflight=8)
    barrier.wait()

    names = ('train', 'report', 'eval') if args.eval_envs else (
        'train', 'report')
    sources = {source: remote_stream.RemoteStream(
        args, source, stop, link.learner,
        shared=(source == 'train' and args.shared_batches))
        for source in names}

    def evaluate(stream):
        carry = agent.init_report(args.batch_size)
        agg = elements.Agg()
        for _ in range(args.consec_report * args.report_batches):
            batch = next(stream, None)
            if batch is None:
                return None
            with link.train_lock:
                carry, metrics = agent.report(carry, batch)
            agg.add(metrics)
        return agg.result()

    def make_stream(source):
        stream = embodied.streams.Stateless(sources[source])
        return iter(agent.stream(stream))

    stream_train = make_stream('train')
    stream_report = make_stream('report')
    stream_eval = make_stream('eval') if args.eval_envs else None
    carry = agent.init_train(args.batch_size)
    updates = collections.deque()

    try:
        while not stop.is_set():
            with elements.timer.section('batch_next'):
                batch = next(stream_train, None)
            if batch is None:
                break
            start = time.monotonic()
            with elements.timer.section('train_step'), link.train_lock:
                carry, outs, mets = agent.train(carry, batch)
            link.learner['train_seconds'] += time.monotonic() - start
            link.learner['train_steps'] += 1
            if 'replay' in outs:
                with elements.timer.section('replay_update'):
                    updates.append(updater.update(outs['replay']))
                while updates and updates[0].done():
                    updates.popleft().result()
            agg.add(mets)
            fps.step(batch_steps)

            if should_report(skip=not sources['report'].ready_soon()):
                with elements.timer.section('report'):
                    metrics = evaluate(stream_report)
                    if metrics is not None:
                        logger.add(prefix(metrics, 'report'))
                    if args.eval_envs and sources['eval'].ready_soon():
                        metrics = evaluate(stream_eval)
                        if metrics is not None:
                            logger.add(prefix(metrics, 'eval'))
                link.learner['reports'] += 1

            if should_log():
                stats = {}
                stats['fps/train'] = fps.result()
                stats.update(timing.timer_metrics('timer/agent'))
                stats.update(prefix(agg.result(), 'train'))
                stats.update(prefix(usage.stats(), 'usage/agent'))
                for source, stream in sources.items():
                    stats.update(prefix(
                        stream.client.stats(), f'client/{source}'))
                logger.add(stats)
        final = agg.result()
        if final:
            logger.add(prefix(final, 'train')).result()
    finally:
        link.learner_done.set()
        for client in (logger, updater):
            client.close(1)
        for stream in sources.values():
            stream.close()
    return 0


def resume_tag(logdir):
    """The newest checkpoint tag complete for agent, replay and logger."""
    return cplib.latest_common([
        cplib.Checkpoint(saving.directory(logdir, role))
        for role in saving.ROLES])


# Replay


def parallel_replay(make_replay_train, make_replay_eval, make_stream, args):
    """Serves the train and eval replays, enforcing the train ratio."""
    args = wiring.complete(args)
    replay_train = wiring.loads(make_replay_train)()
    replay_eval = wiring.loads(make_replay_eval)()
    for replay in (replay_train, replay_eval):
        if hasattr(replay, 'save_wait'):
            replay.save_wait = True  # A checkpoint must not outrun its files.
    make_stream = wiring.loads(make_stream)
    stream_train = iter(make_stream(replay_train, 'train'))
    stream_report = iter(make_stream(replay_train, 'report'))
    stream_eval = iter(make_stream(replay_eval, 'eval'))

    limiter = limiters.SamplesPerInsert(
        args.train_ratio / args.batch_length,
        tolerance=4 * args.batch_size,
        minsize=args.batch_size * replay_train.length)
    release = threading.Event()
    lock = threading.Lock()  # Keeps saves apart from inserts and updates.
    # Notified after inserts, samples and the release, so that limiter waits
    # wake at once instead of at their next poll (see `limiters.wait`).
    changed = threading.Condition()
    counts = collections.Counter()
    limit_agg = elements.Agg()
    report_every = args.wait_report
    slot_writer = rpc.slots.SlotWriter()

    def wait(predicate, message, info=None):
        try:
            return limiters.wait(
                predicate, message, info, report_every, release, changed)
        except limiters.Released:
            return None

    def notify():
        with changed:
            changed.notify_all()

    def release_waits():
        release.set()
        notify()

    def may_insert():
        # The limiter's minsize counts inserts, but a sequence needs `length`
        # steps of one env: with many envs the replay can still be empty. A
        # sampler then waits for data, so inserts must not wait for it.
        return limiter.want_insert() or not len(replay_train)

    def add_batch(data):
        envids = data.pop('envid')
        is_eval = data.pop('is_eval').astype(bool)
        if is_eval.any():
            rows = np.flatnonzero(is_eval)
            with lock:
                add_rows(replay_eval, {k: v[rows] for k, v in data.items()},
                         envids[rows].tolist())
            notify()
            counts['eval_inserts'] += len(rows)
            rows = np.flatnonzero(~is_eval)
            data = {k: v[rows] for k, v in data.items()}
            envids = envids[rows]
        envids = envids.tolist()
        done = 0
        while done < len(envids):
            with elements.timer.section('replay_insert_wait'):
                dur = wait(may_insert, 'Replay insert is waiting',
                           limiter.state)
            # Released at shutdown: insert anyway, so replay and logger agree.
            released = dur is None
            dur = dur or 0.0
            limit_agg.add('insert_wait_dur', dur, agg='sum')
            counts['insert_wait_seconds'] += dur
            counts['insert_waits'] += dur > 0
            with lock:  # As many as the limiter allows in one go.
                stop = done
                while stop < len(envids) and (released or may_insert()):
                    limiter.insert()
                    stop += 1
                    if limiter.size > limiter.minsize:
                        counts['inserts_after_minsize'] += 1
                add_rows(replay_train,
                         {k: v[done:stop] for k, v in data.items()},
                         envids[done:stop])
            counts['inserts'] += stop - done
            done = stop
            notify()
        return {}

    def sample_batch_train(target=None):
        """One batch; with a `target` (the learner's shared-memory slots,
        see `rpc.slots`), one batch per slot, answered by slot numbers."""
        if target is None:
            return sample_train()
        replies = []
        for one in rpc.slots.split(target):
            batch = sample_train()
            if batch is None:
                return None  # Shutting down; the learner stops on None.
            replies.append(slot_writer.write(one, batch))
        return replies

    def sample_train():
        start = time.monotonic()
        with elements.timer.section('replay_sample_wait'):
            needed = args.batch_size
            while needed:
                dur = wait(limiter.want_sample, 'Replay sample is waiting',
                           limiter.state)
                if dur is None:
                    return None  # Shutting down; the learner stops on None.
                while needed and limiter.try_sample():
                    needed -= 1
                notify()  # The samples may let a waiting insert go on.
        # The limiter counts inserts of all envs: with more envs than
        # batch_size it can allow samples before any sequence is complete.
        if wait(lambda: len(replay_train) > 0, 'Replay train is waiting '
                'for its first sequence', lambda: {
                    'items': len(replay_train),
                    'inserts': limiter.size}) is None:
            return None
        waited = time.monotonic() - start
        limit_agg.add('sample_wait_dur', waited, agg='sum')
        counts['sample_wait_seconds'] += waited
        counts['samples'] += args.batch_size
        return next(stream_train)  # The replay is thread-safe.

    def sample_from(replay, stream, what):
        def sample():
            if wait(lambda: len(replay) > 0, f'Replay {what} is waiting') is None:
                return None  # Shutting down; the learner stops on None.
            return next(stream)
        return sample

    def update(data):
        with lock:
            replay_train.update(data)

    def status():
        ratio = counts['samples'] * args.batch_length / max(
            1, counts['inserts_after_minsize'])
        return {
            **{k: float(v) for k, v in counts.items()},
            'size': len(replay_train), 'eval_size': len(replay_eval),
            'minsize': limiter.minsize, 'train_ratio': ratio,
        }

    def save(tag):
        with lock:
            cp.save(int(tag))
        for entry, replay in (('replay', replay_train),
                              ('replay_eval', replay_eval)):
            try:
                replay_files.prune(
                    getattr(replay, 'directory', None), cp.directory, entry)
            except OSError as e:
                print(f'Could not delete old {entry} chunk files: {e}',
                      flush=True)
        return int(tag)

    cp = cplib.Checkpoint(saving.directory(args.logdir, 'replay'),
                          args.save_keep)
    cp.replay = replay_train
    cp.replay_eval = replay_eval
    cp.limiter = limiter
    tag = resume_tag(args.logdir)
    if tag is not None:
        cp.load(tag)
        print(f'Replay resumed from the save at step {tag} '
              f'({len(replay_train)} items).', flush=True)

    done = threading.Event()
    logger = wiring.connect(args, 'logger', 'ReplayLogger', maxinflight=4)
    should_log = embodied.LocalClock(args.log_every)
    usage = elements.Usage(**args.usage.update(nvsmi=False))

    logged = {'inserts': 0.0, 'insert_waits': 0.0}

    def metrics():
        current = status()
        stats = {}
        stats.update(timing.timer_metrics('timer/replay'))
        stats.update(prefix(limit_agg.result(), 'limiter'))
        inserts = current.get('inserts', 0.0) - logged['inserts']
        waits = current.get('insert_waits', 0.0) - logged['insert_waits']
        if inserts:
            stats['limiter/insert_wait_frac'] = waits / inserts
        logged.update(inserts=current.get('inserts', 0.0),
                      insert_waits=current.get('insert_waits', 0.0))
        stats['limiter/train_ratio'] = current['train_ratio']
        for key in ('inserts', 'eval_inserts', 'samples'):
            stats[f'parallel_replay/{key}'] = current.get(key, 0.0)
        stats.update(prefix(replay_train.stats(), 'replay'))
        stats.update(prefix(replay_eval.stats(), 'replay_eval'))
        stats.update(prefix(usage.stats(), 'usage/replay'))
        stats.update(prefix(server.stats(), 'server/replay'))
        return stats

    def shutdown():
        logger.add(metrics()).result()  # Arrives before the logger's last write.
        done.set()

    server = rpc.Server(args.replay_addr, 'Replay',
                        ipv6=wiring.ipv6(args))
    server.bind('add_batch', add_batch)
    server.bind('sample_batch_train', sample_batch_train)
    server.bind('sample_batch_report', sample_from(
        replay_train, stream_report, 'report'))
    server.bind('sample_batch_eval', sample_from(
        replay_eval, stream_eval, 'eval'))
    server.bind('update', update)
    server.bind('status', status)
    server.bind('save', save)
    server.bind('release', release_waits)
    server.bind('shutdown', shutdown)
    server.start()
    try:
        while not done.wait(0.5):
            if should_log():
                logger.add(metrics())
    finally:
        release_waits()
        for replay in (replay_train, replay_eval):
            hasattr(replay, 'close') and replay.close()
        server.close()
        slot_writer.close()
        logger.close(1)
    return 0


def add_rows(replay, data, envids):
    """Adds row i of `data` as a step of env `envids[i]`, in one call when
    the replay has `add_batch` (a replay of the caller's own may not)."""
    if hasattr(replay, 'add_batch'):
        return replay.add_batch(data, envids)
    for i, envid in enumerate(envids):
        replay.add({k: v[i] for k, v in data.items()}, envid)


# Logger


@elements.timer.section('logger')
def parallel_logger(make_logger, args):
    """Counts the global step (train env steps), aggregates episodes and
    writes metrics."""
    args = wiring.complete(args)
    logger = wiring.loads(make_logger)()
    step = logger.step
    lock = threading.Lock()
    episodes = {
        False: episodeslib.EpisodeStats(logger, 'episode'),
        True: episodeslib.EpisodeStats(logger, 'eval_episode')}
    parallel = elements.Agg()
    updated = {}
    counts = collections.Counter()

    cp = cplib.Checkpoint(saving.directory(args.logdir, 'logger'),
                          args.save_keep)
    cp.step = step
    tag = resume_tag(args.logdir)
    if tag is not None:
        cp.load(tag)
        print(f'Logger resumed at step {int(step)}.', flush=True)

    def add(metrics):
        with lock:
            logger.add(metrics)
            counts['adds'] += 1

    def tran(trans):
        now = time.monotonic()
        envids = trans.pop('envid').tolist()
        is_eval = trans['is_eval']
        with lock:
            step.increment(int((~is_eval).sum()))
            counts['env_steps'] += len(envids)
            parallel.add('ep_starts', trans['is_first'].sum(), agg='sum')
            parallel.add('ep_ends', trans['is_last'].sum(), agg='sum')
            for i, envid in enumerate(envids):
                row = {k: v[i] for k, v in trans.items()}
                evaluating = bool(row.pop('is_eval'))
                updated[envid] = (now, evaluating)
                episodes[evaluating].add(row, envid)
            for envid, (last, evaluating) in list(updated.items()):
                if now - last >= args.episode_timeout:
                    print(f'Dropping the episode of env {envid}: no step '
                          f'for {args.episode_timeout} s.', flush=True)
                    episodes[evaluating].drop(envid)
                    del updated[envid]

    def abandon(envids):
        """Drops the unfinished episodes of envs whose worker crashed."""
        with lock:
            for envid in (int(x) for x in envids):
                parallel.add('env_crashes', 1, agg='sum')
                counts['adds'] += 1
                updated.pop(envid, None)
                for stats in episodes.values():
                    if envid in stats.episodes:
                        stats.drop(envid)
                        parallel.add('ep_abandoned', 1, agg='sum')

    def status():
        return {'step': int(step), 'env_steps': counts['env_steps']}

    def save(tag):
        with lock:
            cp.save(int(tag))
        return int(tag)

    def write():
        with lock:
            if not counts['adds'] and counts['env_steps'] == counts['written']:
                return  # Nothing new: avoid empty writes.
            counts['adds'] = 0
            counts['written'] = counts['env_steps']
            logger.add(parallel.result(), prefix='parallel')
            logger.add(episodes[False].result(), prefix='epstats')
            logger.add(episodes[True].result(), prefix='eval_epstats')
            logger.add(server.stats(), prefix='server/logger')
            logger.write()

    done = threading.Event()
    server = rpc.Server(args.logger_addr, 'Logger',
                        ipv6=wiring.ipv6(args))
    server.bind('add', add)
    server.bind('tran', tran)
    server.bind('abandon', abandon)
    server.bind('status', status)
    server.bind('save', save)
    server.bind('shutdown', done.set)
    server.start()
    should_log = embodied.LocalClock(args.log_every)
    try:
        while not done.wait(0.5):
            server.raise_error()
            if should_log():
                write()
        write()
    finally:
        server.close()
        logger.close()
    return 0


# Launcher


class _Launch:
    """The workers of one `combined` launch and the decisions about them.

    The agent, logger and replay are in `group`; any of them ending ends the
    run (the roles still alive save first, see `_salvage`). Env workers are
    in `envs`, which restarts crashed ones; an env error that a restart
    cannot fix ends the run after a full coordinated save (`_stop`).
    """

    ROLE_OF = {'Agent': 'actor', 'Replay': 'replay', 'Logger': 'logger'}

    def __init__(self, factories, args):
        self.args = args
        self.factories = factories
        self.group = rpc.Supervisor()
        f = factories
        agent_cls = rpc.Process if args.agent_process else rpc.Thread
        self.group.add(agent_cls(parallel_agent, f['agent'], args, name='Agent'))
        self.group.add(rpc.Process(
            parallel_logger, f['logger'], args, name='Logger'))
        if not args.remote_replay:
            self.group.add(rpc.Process(
                parallel_replay, f['replay_train'], f['replay_eval'],
                f['stream'], args, name='Replay'))
        specs = []
        if not args.remote_envs:
            specs = env_workers.specs(f['env_train'], f['env_eval'], args)
        self.envs = envpool.EnvPool(
            specs, args.env_restarts, on_crash=self._env_crashed)
        self.clients = {}
        self.may_exit = ()  # Workers that may end with 0 (while stopping).
        self.progress = progress.Progress(args)
        self.step = 0  # The logger's step when last asked.

    def run(self):
        args = self.args
        start = time.monotonic()
        print(f'Launching {len(self.group.workers) + len(self.envs.slots)} '
              f'workers: actor at {args.actor_addr}, replay at '
              f'{args.replay_addr}, logger at {args.logger_addr}.', flush=True)
        try:
            with stopping.StopSignal() as signal:
                self.group.start()
                self.envs.start()
                self._print_workers()
                try:
                    self._connect(signal)
                    reason = self._loop(start, signal)
                except rpc.WorkerFailed as e:
                    self._fail(e)
                    raise
                self._stop(reason)
        except BaseException:
            self.envs.kill()
            self.group.kill()
            self._shutdown_remote()
            raise
        finally:
            for client in self.clients.values():
                client.close(1)

    def _print_workers(self):
        parts = []
        for worker in self.group.workers + self.envs.workers:
            pid = getattr(worker, 'pid', None)
            parts.append(f'{worker.name} (pid {pid})' if pid else
                         f'{worker.name} (thread)')
        print(f'Workers: {", ".join(parts)}.', flush=True)

    def _check(self):
        """Raises `WorkerFailed` for a worker that ends the run; restarts
        crashed env workers."""
        self.group.check(self.may_exit)
        self.envs.poll()

    def _env_crashed(self, spec, exitcode, error):
        client = self.clients.get('logger')
        if client is None:
            return
        try:
            client.call('abandon', list(spec.envids)).result(timeout=10)
        except Exception as e:
            print(f'Could not tell the logger to drop the episodes of '
                  f'{spec.name}: {type(e).__name__}: {e}', flush=True)

    def _fail(self, error):
        """Ends the run for `error`, saving first what can be saved."""
        print(f'Ending the run: {error}', flush=True)
        if error.name in self.envs.names and len(self.clients) == 3:
            # Agent, replay and logger are fine: stop as usual, then fail.
            self.envs.stopping()
            try:
                self._stop(f'Env worker {error.name} failed', failed=True)
            except Exception as e:
                print(f'Could not save and stop in order: '
                      f'{type(e).__name__}: {e}', flush=True)
            return
        self._salvage(error)

    def _salvage(self, error, timeout=60):
        """After a role died: the roles still alive save under the last step,
        as far as they can without it. A resume picks the newest save that
        all three roles hold, so a partial save never mixes into one."""
        dead = self.ROLE_OF.get(error.name)
        alive = [role for role in ('replay', 'logger', 'actor')
                 if role != dead and role in self.clients and
                 self.clients[role].connected]
        if not alive or dead is None:
            return
        step = self.step
        if 'logger' in alive:
            try:
                step = int(self.clients['logger'].call('status').result(
                    timeout=5)['step'])
            except Exception:
                pass
        print(f'Saving what is left at step {step}: {", ".join(alive)}.',
              flush=True)
        if 'actor' in alive:
            self._try(lambda: self.clients['actor'].call('pause').result(
                timeout=5))
        futures = {role: self.clients[role].call('save', step)
                   for role in alive}
        deadline = time.monotonic() + timeout
        for role, future in futures.items():
            self._try(lambda: future.result(
                timeout=max(0.1, deadline - time.monotonic())),
                f'The {role} could not save')
        if 'actor' in alive:
            # An agent thread ends only when asked; its process is ours.
            self._try(lambda: self.clients['actor'].call('shutdown').result(
                timeout=5))

    def _try(self, fn, what=None):
        try:
            return fn()
        except Exception as e:
            if what:
                print(f'{what}: {type(e).__name__}: {e}', flush=True)

    def _shutdown_remote(self):
        """Best effort: tells a separately launched replay to exit too."""
        client = self.clients.get('replay')
        if self.args.remote_replay and client and client.connected:
            try:
                client.call('shutdown').result(timeout=2)
            except Exception:
                pass

    def _connect(self, signal):
        timeout = self.args.connect_timeout
        for role in ('logger', 'replay', 'actor'):
            addr = self.args[f'{role}_addr']
            start = time.monotonic()
            next_report = start + self.args.wait_report
            client = rpc.Client(
                rpc.addresses.client_addr(addr, wiring.ipv6(self.args)),
                f'Launcher{role.title()}', logging=False)
            while not client.connect(0.2):
                self._check()
                now = time.monotonic()
                if now - start > timeout:
                    client.close(1)
                    raise rpc.Unreachable(
                        f'The {role} at {addr} did not come up within '
                        f'{timeout} s (run.connect_timeout).')
                if now >= next_report:
                    next_report = now + self.args.wait_report
                    print(f'Launcher: waiting for the {role} at {addr} for '
                          f'{now - start:.0f} s (giving up after {timeout} s, '
                          f'run.connect_timeout).', flush=True)
            self.clients[role] = client

    def _call(self, role, method, *args, timeout=None):
        future = self.clients[role].call(method, *args)
        while not future.wait(0.1):
            self._check()
            if timeout is not None:
                timeout -= 0.1
                if timeout <= 0:
                    raise TimeoutError(f'{role}.{method} did not answer.')
        return future.result()

    def _loop(self, start, signal):
        args = self.args
        should_save = embodied.GlobalClock(args.save_every)
        should_log = embodied.LocalClock(args.log_every)
        should_save()
        should_log()
        if resume_tag(args.logdir) is None:
            self._save()  # A first consistent save, as load_or_save would.
        while True:
            self._check()
            status = self._call('logger', 'status')
            step = self.step = int(status['step'])
            self.progress.observe(step)
            if args.remote_envs and not status['env_steps'] and (
                    time.monotonic() - start > args.connect_timeout):
                raise rpc.Unreachable(
                    f'No env worker reached the actor at {args.actor_addr} '
                    f'within {args.connect_timeout} s (run.connect_timeout); '
                    f'start them with --script parallel_envs.')
            if signal.requested:
                return 'Received a stop signal'
            if step >= args.steps:
                return f'Reached run.steps ({int(args.steps)})'
            if args.duration and time.monotonic() - start >= args.duration:
                return f'Reached run.duration ({args.duration} s)'
            if should_save():
                self._save()
            if should_log():
                self._print_progress(step)
            signal.event.wait(0.2)

    def _quiesce(self, timeout):
        """Pauses the actor; True once everything it sent has arrived."""
        self._call('actor', 'pause')
        deadline = time.monotonic() + timeout
        while not self._call('actor', 'drained'):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def _save(self, final=False):
        """Saves agent, replay and logger under the current step."""
        drained = self._quiesce(STOP_DRAIN if final else self.args.drain_timeout)
        if not drained:
            if not final:
                print('Skipping this save: transitions did not arrive within '
                      f'{self.args.drain_timeout} s.', flush=True)
                self._call('actor', 'resume')
                return None
            print('Saving with transitions still in flight.', flush=True)
        step = int(self._call('logger', 'status')['step'])
        futures = [self.clients[role].call('save', step)
                   for role in ('replay', 'logger', 'actor')]
        for future in futures:
            while not future.wait(0.1):
                self._check()
            future.result()
        print(f'Saved checkpoints at step {step}.', flush=True)
        if not final:
            self._call('actor', 'resume')
        return step

    def _stop(self, reason, failed=False):
        """Drains, saves and ends every worker in order. With `failed`, an
        env worker already failed: the run still saves, and then fails."""
        self.envs.stopping()  # A crash from here on needs no restart.
        step = int(self._call('logger', 'status')['step'])
        print(f'{reason} at step {step}: saving and stopping.', flush=True)
        # Drain while the learner still samples, so limiter waits end.
        self._quiesce(STOP_DRAIN)
        self._call('actor', 'stop_learner')
        self._call('replay', 'release')  # Inserts left skip the limiter.
        self._save(final=True)
        self._print_progress(step)
        summary = self.progress.summary(
            self._call('actor', 'status'), self.envs.restarts)
        print(f'[Summary] {summary}', flush=True)
        self.may_exit = [w.name for w in self.group.workers]
        self._call('actor', 'stop_envs')
        left = self.envs.wait(10)
        if left:
            print(f'Killing env workers that did not exit: {left}', flush=True)
            self.envs.kill()
        self._shutdown('actor')
        agent = self.group.workers[0]
        deadline = time.monotonic() + 10
        while agent.exitcode is None and time.monotonic() < deadline:
            time.sleep(0.05)
        self._shutdown('replay')
        self._shutdown('logger')
        left = self.group.wait(15)
        if left:
            print(f'Killing workers that did not exit: {left}', flush=True)
            self.group.kill()
        self.group.check(expected=[w.name for w in self.group.workers])
        if not failed:
            for name, code in self.envs.failed():
                print(f'Env worker {name} ended with exit code {code} while '
                      f'stopping.', flush=True)
        print('All workers exited.', flush=True)

    def _shutdown(self, role, timeout=10):
        """Asks a role to exit. Its reply can be lost when the role closes
        its server right away, so a missing reply is no error: the workers'
        exit codes decide."""
        try:
            self._call(role, 'shutdown', timeout=timeout)
        except TimeoutError:
            pass

    def _print_progress(self, step):
        actor = self._call('actor', 'status')
        replay = self._call('replay', 'status')
        line = self.progress.line(time.monotonic(), step, actor, replay)
        print(f'[Progress] {line}', flush=True)


# Env workers (kept here, the original's entry points).

parallel_env = env_workers.parallel_env
parallel_envs = env_workers.parallel_envs


if __name__ == '__main__':
    from embodied import main
    main.main()
