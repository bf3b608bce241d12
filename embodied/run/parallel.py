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
"""

import collections
import functools
import threading
import time

import cloudpickle
import elements
import numpy as np
import portal
import psutil

import embodied
from embodied import rpc
from embodied.core import checkpoint as cplib
from embodied.core import limiters
from embodied.run import episodes as episodeslib
from embodied.run import saving
from embodied.run import stopping
from embodied.run import timing

ADDR_KEYS = ('actor_addr', 'replay_addr', 'logger_addr')

# Keys this runner reads beyond the original's `args`, with their defaults.
DEFAULTS = dict(
    envs_per_worker=1,      # envs stepped by one env worker process
    env_restarts=10,        # restarts of a crashed env worker
    wait_report=30,         # seconds before a wait is reported
    connect_timeout=120,    # seconds to reach another role
    actor_flush=0.02,       # seconds before a partial policy batch runs
    save_keep=3,            # checkpoints kept per role
    drain_timeout=30,       # seconds a save waits for transitions in flight
)

STOP_KEY = '__stop__'       # in an act reply: the env worker should exit
STOP_DRAIN = 3              # seconds a stop waits for transitions in flight
PORT_ATTEMPTS = 3

prefix = lambda d, p: {f'{p}/{k}': v for k, v in d.items()}


def combined(
        make_agent, make_replay_train, make_replay_eval, make_env_train,
        make_env_eval, make_stream, make_logger, args):
    """Runs the whole training launch until it stops; see the module doc."""
    args = _complete(args)
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
    factories = {k: _dumps(v) for k, v in factories.items()}
    auto = any('{auto}' in str(args[k]) for k in ADDR_KEYS)
    for attempt in range(PORT_ATTEMPTS):
        filled = rpc.addresses.fill_auto(
            {k: args[k] for k in ADDR_KEYS}, _ipv6(args))
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
    args = _complete(args)
    agent = _loads(make_agent)()
    link = _AgentLink()
    actor = rpc.Thread(parallel_actor, agent, link, args, name='Actor')
    learner = rpc.Thread(parallel_learner, agent, link, args, name='Learner')
    actor.start()
    learner.start()
    while actor.exitcode is None or learner.exitcode is None:
        for thread in (actor, learner):
            if thread.exitcode not in (None, 0):
                link.abort()
                print(f"Agent: the {thread.name.lower()} thread failed.",
                      flush=True)
                return thread.exitcode  # Keeps EXIT_PORT_TAKEN for a retry.
        if learner.exitcode == 0 and not link.learner_stop.is_set():
            return 1  # The learner must only end when asked to.
        time.sleep(0.05)
    return 0


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
    args = _complete(args)
    link = _link(barrier)
    islist = lambda x: isinstance(x, list)
    initial = agent.init_policy(args.actor_batch)
    initial = elements.tree.map(lambda x: x[0], initial, isleaf=islist)
    carries = collections.defaultdict(lambda: initial)
    barrier.wait()  # Do not collect data before the learner restored.

    backlog = 8 * args.actor_threads
    timeout = args.connect_timeout
    replay = rpc.connect(
        args.replay_addr, 'ActorReplay', timeout, maxinflight=backlog)
    logger = rpc.connect(
        args.logger_addr, 'ActorLogger', timeout, maxinflight=backlog)
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

    @elements.timer.section('postfn')
    def postfn(trans):
        logs = {k: v for k, v in trans.items() if k.startswith('log/')}
        data = {k: v for k, v in trans.items() if not k.startswith('log/')}
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
        ipv6=_ipv6(args))
    server.bind(
        'act', workfn, postfn, batch=args.actor_batch,
        workers=args.actor_threads)
    server.bind('status', status)
    server.bind('pause', lambda: server.pause('act'))
    server.bind('resume', lambda: server.resume('act'))
    server.bind('drained', drained)
    server.bind('save', save)
    server.bind('stop_learner', stop_learner)
    server.bind('stop_envs', lambda: server.answer('act', {STOP_KEY: True}))
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
    args = _complete(args)
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

    timeout = args.connect_timeout
    logger = rpc.connect(
        args.logger_addr, 'LearnerLogger', timeout, maxinflight=4)
    updater = rpc.connect(
        args.replay_addr, 'LearnerReplayUpdater', timeout, maxinflight=8)
    barrier.wait()

    names = ('train', 'report', 'eval') if args.eval_envs else (
        'train', 'report')
    sources = {source: _RemoteStream(args, source, stop, link.learner)
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

            if should_report(skip=not sources['report'].ready()):
                with elements.timer.section('report'):
                    metrics = evaluate(stream_report)
                    if metrics is not None:
                        logger.add(prefix(metrics, 'report'))
                    if args.eval_envs and sources['eval'].ready():
                        metrics = evaluate(stream_eval)
                        if metrics is not None:
                            logger.add(prefix(metrics, 'eval'))
                link.learner['reports'] += 1

            if should_log():
                stats = {}
                stats['fps/train'] = fps.result()
                stats['timer/agent'] = timing.timer_summary()
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


class _RemoteStream:
    """Batches from the replay's `sample_batch_<source>`, requested
    `prefetch` ahead from the start. Ends (StopIteration) when `stop` is set
    or the replay shuts down."""

    def __init__(self, args, source, stop, counters, prefetch=2):
        self.source = source
        self.stop = stop
        self.counters = counters
        self.client = rpc.connect(
            args.replay_addr, f'LearnerReplay{source.title()}',
            args.connect_timeout)
        self.call = functools.partial(
            self.client.call, f'sample_batch_{source}')
        self.futures = collections.deque(
            self.call() for _ in range(prefetch))
        self.received = 0

    def ready(self):
        """Whether a batch has arrived (so `next` will not wait long)."""
        return self.received > 0 or self.futures[0].done()

    def __iter__(self):
        return self

    def __next__(self):
        self.futures.append(self.call())
        start = time.monotonic()
        with elements.timer.section(f'stream_{self.source}_response'):
            data = rpc.result(self.futures.popleft(), self.stop)
        self.counters[f'{self.source}_wait_seconds'] += (
            time.monotonic() - start)
        if data is None:
            raise StopIteration
        self.received += 1
        return data

    def close(self):
        self.client.close(1)


def resume_tag(logdir):
    """The newest checkpoint tag complete for agent, replay and logger."""
    return cplib.latest_common([
        cplib.Checkpoint(saving.directory(logdir, role))
        for role in saving.ROLES])


# Replay


def parallel_replay(make_replay_train, make_replay_eval, make_stream, args):
    """Serves the train and eval replays, enforcing the train ratio."""
    args = _complete(args)
    replay_train = _loads(make_replay_train)()
    replay_eval = _loads(make_replay_eval)()
    for replay in (replay_train, replay_eval):
        if hasattr(replay, 'save_wait'):
            replay.save_wait = True  # A checkpoint must not outrun its files.
    make_stream = _loads(make_stream)
    stream_train = iter(make_stream(replay_train, 'train'))
    stream_report = iter(make_stream(replay_train, 'report'))
    stream_eval = iter(make_stream(replay_eval, 'eval'))

    limiter = limiters.SamplesPerInsert(
        args.train_ratio / args.batch_length,
        tolerance=4 * args.batch_size,
        minsize=args.batch_size * replay_train.length)
    release = threading.Event()
    lock = threading.Lock()  # Keeps saves apart from inserts and updates.
    counts = collections.Counter()
    limit_agg = elements.Agg()
    report_every = args.wait_report

    def wait(predicate, message, info=None):
        try:
            return limiters.wait(
                predicate, message, info, report_every, release)
        except limiters.Released:
            return None

    def may_insert():
        # The limiter's minsize counts inserts, but a sequence needs `length`
        # steps of one env: with many envs the replay can still be empty. A
        # sampler then waits for data, so inserts must not wait for it.
        return limiter.want_insert() or not len(replay_train)

    def add_batch(data):
        envids = data.pop('envid').tolist()
        is_eval = data.pop('is_eval').tolist()
        for i, envid in enumerate(envids):
            tran = {k: v[i] for k, v in data.items()}
            if is_eval[i]:
                with lock:
                    replay_eval.add(tran, envid)
                counts['eval_inserts'] += 1
                continue
            with elements.timer.section('replay_insert_wait'):
                dur = wait(may_insert, 'Replay insert is waiting',
                           limiter.state)
            # Released at shutdown: insert anyway, so replay and logger agree.
            dur = dur or 0.0
            limit_agg.add('insert_wait_dur', dur, agg='sum')
            limit_agg.add('insert_wait_frac', dur > 0, agg='avg')
            counts['insert_wait_seconds'] += dur
            with lock:
                limiter.insert()
                replay_train.add(tran, envid)
            counts['inserts'] += 1
            if limiter.size > limiter.minsize:
                counts['inserts_after_minsize'] += 1
        return {}

    def sample_batch_train():
        start = time.monotonic()
        with elements.timer.section('replay_sample_wait'):
            for _ in range(args.batch_size):
                dur = wait(limiter.want_sample, 'Replay sample is waiting',
                           limiter.state)
                if dur is None:
                    return None  # Shutting down; the learner stops on None.
                limiter.sample()
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
    timeout = args.connect_timeout
    logger = rpc.connect(args.logger_addr, 'ReplayLogger', timeout,
                         maxinflight=4)
    should_log = embodied.LocalClock(args.log_every)
    usage = elements.Usage(**args.usage.update(nvsmi=False))

    def metrics():
        current = status()
        stats = {}
        stats['timer/replay'] = timing.timer_summary()
        stats.update(prefix(limit_agg.result(), 'limiter'))
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
                        ipv6=_ipv6(args))
    server.bind('add_batch', add_batch)
    server.bind('sample_batch_train', sample_batch_train)
    server.bind('sample_batch_report', sample_from(
        replay_train, stream_report, 'report'))
    server.bind('sample_batch_eval', sample_from(
        replay_eval, stream_eval, 'eval'))
    server.bind('update', update)
    server.bind('status', status)
    server.bind('save', save)
    server.bind('release', release.set)
    server.bind('shutdown', shutdown)
    server.start()
    try:
        while not done.wait(0.5):
            if should_log():
                logger.add(metrics())
    finally:
        release.set()
        for replay in (replay_train, replay_eval):
            hasattr(replay, 'close') and replay.close()
        server.close()
        logger.close(1)
    return 0


# Logger


@elements.timer.section('logger')
def parallel_logger(make_logger, args):
    """Counts the global step (train env steps), aggregates episodes and
    writes metrics."""
    args = _complete(args)
    logger = _loads(make_logger)()
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
                        ipv6=_ipv6(args))
    server.bind('add', add)
    server.bind('tran', tran)
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


# Envs


@elements.timer.section('env')
def parallel_env(make_env, envid, args, is_eval=False):
    """One env worker stepping one env; see `parallel_envs` for more."""
    return _env_worker(make_env, [envid], args, is_eval)


def parallel_envs(make_env, make_env_eval, args):
    """Runs all env workers of `args` (`run.envs_per_worker` envs each) until
    the actor tells them to stop; for envs launched apart from `combined`."""
    args = _complete(args)
    group = rpc.Supervisor()
    for worker in _env_workers(_dumps(make_env), _dumps(make_env_eval), args):
        group.add(worker)
    group.start()
    with stopping.StopSignal() as stop:
        try:
            while group.running() and not stop.requested:
                group.check(expected=[w.name for w in group.workers])
                time.sleep(0.1)
        finally:
            group.kill()
    group.check(expected=[w.name for w in group.workers])
    return 0


def _env_workers(make_env_train, make_env_eval, args):
    size = max(1, args.envs_per_worker)
    train = list(range(args.envs))
    evals = list(range(args.envs, args.envs + args.eval_envs))
    for envids, make, is_eval in (
            (train, make_env_train, False), (evals, make_env_eval, True)):
        for i in range(0, len(envids), size):
            ids = envids[i:i + size]
            name = f'Env{ids[0]:05}' + (f'-{ids[-1]:05}' if len(ids) > 1 else '')
            yield rpc.Process(
                _env_worker, make, ids, args, is_eval, name=name)


def _env_worker(make_env, envids, args, is_eval):
    args = _complete(args)
    make_env = _loads(make_env)
    name = f'Env{envids[0]:05}' + (
        f'-{envids[-1]:05}' if len(envids) > 1 else '')
    envs = [make_env(i) for i in envids]
    fixed = {
        'envid': np.asarray(envids, np.int32),
        'is_eval': np.full(len(envids), bool(is_eval))}
    fps = elements.FPS()
    should_log = embodied.LocalClock(args.log_every)
    logger = None
    if envids[0] == 0 and '{auto}' not in args.logger_addr:
        logger = rpc.connect(args.logger_addr, f'{name}Logger',
                             args.connect_timeout, maxinflight=1)

    def connect():
        return rpc.connect(args.actor_addr, name, args.connect_timeout,
                           autoconn=False)

    def reset_actions():
        acts = []
        for env in envs:
            act = {k: v.sample() for k, v in env.act_space.items()}
            act['reset'] = True
            acts.append(act)
        return acts

    actor = connect()
    acts = reset_actions()
    try:
        while True:
            with elements.timer.section('step'):
                obs = [env.step(act) for env, act in zip(envs, acts)]
            batch = {k: np.stack([o[k] for o in obs]) for k in obs[0]}
            batch.update(fixed)
            fps.step(len(envs))
            try:
                with elements.timer.section('request'):
                    reply = actor.act(batch).result()
            except portal.Disconnected:
                print(f'[{name}] Lost the actor; reconnecting and starting '
                      f'new episodes.', flush=True)
                actor.close(1)
                actor = connect()
                acts = reset_actions()
                continue
            if STOP_KEY in reply:
                return 0
            acts = [{k: v[i] for k, v in reply.items()}
                    for i in range(len(envs))]
            if logger and should_log():
                logger.add({'fps/env': fps.result(),
                            'timer/env': timing.timer_summary()})
    finally:
        actor.close(1)
        logger and logger.close(1)
        for env in envs:
            env.close()


# Launcher


class _Launch:
    """The workers of one `combined` launch and the decisions about them."""

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
        if not args.remote_envs:
            for worker in _env_workers(f['env_train'], f['env_eval'], args):
                self.group.add(worker)
        self.clients = {}
        self.may_exit = ()  # Workers that may end with 0 (while stopping).
        self.progress = _Progress(args)

    def run(self):
        args = self.args
        start = time.monotonic()
        print(f'Launching {len(self.group.workers)} workers: actor at '
              f'{args.actor_addr}, replay at {args.replay_addr}, logger at '
              f'{args.logger_addr}.', flush=True)
        try:
            with stopping.StopSignal() as signal:
                self.group.start()
                self._connect(signal)
                reason = self._loop(start, signal)
                self._stop(reason)
        except BaseException:
            self.group.kill()
            self._shutdown_remote()
            raise
        finally:
            for client in self.clients.values():
                client.close(1)

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
            deadline = time.monotonic() + timeout
            client = rpc.Client(
                rpc.addresses.client_addr(addr, _ipv6(self.args)),
                f'Launcher{role.title()}', logging=False)
            self.clients[role] = client
            while not client.connect(0.2):
                self.group.check()
                if time.monotonic() > deadline:
                    raise rpc.Unreachable(
                        f'The {role} at {addr} did not come up within '
                        f'{timeout} s (run.connect_timeout).')

    def _call(self, role, method, *args, timeout=None):
        future = self.clients[role].call(method, *args)
        while not future.wait(0.1):
            self.group.check(self.may_exit)
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
            self.group.check()
            step = int(self._call('logger', 'status')['step'])
            self.progress.observe(step)
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
                self.group.check(self.may_exit)
            future.result()
        print(f'Saved checkpoints at step {step}.', flush=True)
        if not final:
            self._call('actor', 'resume')
        return step

    def _stop(self, reason):
        step = int(self._call('logger', 'status')['step'])
        print(f'{reason} at step {step}: saving and stopping.', flush=True)
        # Drain while the learner still samples, so limiter waits end.
        self._quiesce(STOP_DRAIN)
        self._call('actor', 'stop_learner')
        self._call('replay', 'release')  # Inserts left skip the limiter.
        self._save(final=True)
        self._print_progress(step)
        summary = self.progress.summary(self._call('actor', 'status'))
        print(f'[Summary] {summary}', flush=True)
        self.may_exit = [w.name for w in self.group.workers]
        self._call('actor', 'stop_envs')
        self._call('actor', 'shutdown')
        agent = self.group.workers[0]
        deadline = time.monotonic() + 10
        while agent.exitcode is None and time.monotonic() < deadline:
            time.sleep(0.05)
        self._call('replay', 'shutdown')
        self._call('logger', 'shutdown')
        left = self.group.wait(15)
        if left:
            print(f'Killing workers that did not exit: {left}', flush=True)
            self.group.kill()
        self.group.check(expected=[w.name for w in self.group.workers])
        print('All workers exited.', flush=True)

    def _print_progress(self, step):
        actor = self._call('actor', 'status')
        replay = self._call('replay', 'status')
        line = self.progress.line(time.monotonic(), step, actor, replay)
        print(f'[Progress] {line}', flush=True)


class _Progress:
    """The launcher's progress lines and final summary from role status."""

    SERVER_KEYS = ('batches', 'rows', 'partial', 'wait_seconds',
                   'busy_seconds')

    def __init__(self, args):
        self.args = args
        self.last = None
        self.totals = collections.Counter()
        self.first_step = None  # Seconds from process start to first step.
        self.running_since = None

    def observe(self, step):
        if step > 0 and self.first_step is None:
            self.running_since = time.monotonic()
            self.first_step = time.time() - psutil.Process().create_time()
            print(f'First env step {self.first_step:.1f} s after launch.',
                  flush=True)

    def line(self, now, step, actor, replay):
        args = self.args
        interval = {k: actor.get(f'server/act/{k}', 0)
                    for k in self.SERVER_KEYS}
        self.totals.update(interval)
        current = dict(
            time=now, step=step, policy=actor.get('policy_steps', 0),
            train=actor.get('learner_train_steps', 0),
            insert_wait=replay.get('insert_wait_seconds', 0),
            sample_wait=replay.get('sample_wait_seconds', 0),
            batch_wait=actor.get('learner_train_wait_seconds', 0))
        last, self.last = self.last, current
        if last is None:
            return f'step {step}/{int(args.steps)}'
        span = max(1e-6, now - last['time'])
        rate = lambda key: (current[key] - last[key]) / span
        share = lambda key: f'{min(100, 100 * rate(key)):.0f}%'
        batches = max(1, interval['batches'])
        return ' | '.join([
            f'step {step}/{int(args.steps)}',
            f'env {rate("policy"):.1f}/s',
            f'train {rate("train"):.2f}/s',
            f'replay {int(replay.get("size", 0))} '
            f'(min {int(replay.get("minsize", 0))})',
            f'waits: replay inserts on limiter {share("insert_wait")}, '
            f'learner samples on limiter {share("sample_wait")}, '
            f'learner on batches {share("batch_wait")}',
            f'policy batches {interval["rows"] / batches:.1f}/'
            f'{args.actor_batch} envs '
            f'({100 * interval["partial"] / batches:.0f}% partial, '
            f'{1000 * interval["wait_seconds"] / batches:.1f} ms filling)',
        ])

    def summary(self, actor):
        """Totals since the first env step, as `key=value` pairs."""
        seconds = time.monotonic() - (self.running_since or time.monotonic())
        steps = actor.get('policy_steps', 0)
        train = actor.get('learner_train_steps', 0)
        batches = max(1, self.totals['batches'])
        latency = (self.totals['wait_seconds'] +
                   self.totals['busy_seconds']) / batches
        values = dict(
            env_steps=int(steps), train_steps=int(train),
            seconds=round(seconds, 2),
            env_fps=round(steps / max(seconds, 1e-6), 1),
            train_fps=round(train / max(seconds, 1e-6), 2),
            policy_batch_ms=round(1000 * latency, 3),
            policy_batch_envs=round(self.totals['rows'] / batches, 2),
            first_step_s=round(self.first_step or -1, 2))
        return ' '.join(f'{k}={v}' for k, v in values.items())


# Helpers


def _complete(args):
    """`args` with defaults for the keys this runner adds."""
    missing = {k: v for k, v in DEFAULTS.items() if k not in args}
    if not missing:
        return args
    return elements.Config({**missing, **args})


def _ipv6(args):
    return bool(args.get('ipv6', portal.context.serverkw.get('ipv6', False)))


def _dumps(fn):
    return fn if isinstance(fn, bytes) else cloudpickle.dumps(fn)


def _loads(fn):
    return cloudpickle.loads(fn) if isinstance(fn, bytes) else fn


if __name__ == '__main__':
    from embodied import main
    main.main()
