"""The replay process: serves the train and eval replays and enforces the
train ratio with a samples-per-insert limiter.

    add_batch(transitions)      eval rows -> eval replay; train rows are
                                inserted as far as the limiter allows, the
                                rest waits (limiter.want_insert)
    sample_batch_train(slots?)  waits for the limiter (want_sample), then a
                                batch; into the learner's shared-memory
                                slots when it names some (`rpc.slots`)
    sample_batch_report / sample_batch_eval   a batch once the replay has data
    update(replay context from agent.train)

Limiter: `samples_per_insert = run.train_ratio / batch_length`, tolerance
`4 * batch_size`, minimum size `batch_size * replay length`. Waits wake on
every insert, sample and release, and report after `run.wait_report` s.

RPC methods served: the above, and for the launcher `status`, `save`,
`release` (waits end: the run is stopping), `shutdown`.
RPC methods called: logger `add` (replay metrics).
"""

import collections
import threading
import time

import elements
import numpy as np

import embodied
from embodied import rpc
from embodied.core import limiters
from embodied.run import arguments
from embodied.run import replay_files
from embodied.run import saving
from embodied.run import timing
from embodied.run import wiring
from embodied.run.wiring import prefix


def parallel_replay(make_replay_train, make_replay_eval, make_stream, args):
    """Serves the train and eval replays, enforcing the train ratio."""
    args = arguments.normalize(args)
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

    cp, tag = saving.resume_role(
        args, 'replay', replay=replay_train, replay_eval=replay_eval,
        limiter=limiter)
    if tag is not None:
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

