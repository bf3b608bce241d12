"""The replay process: serves the train and eval replays and enforces the
train ratio with a samples-per-insert limiter (`ReplayRole`).

Limiter: `samples_per_insert = run.train_ratio / batch_length`, tolerance
`4 * batch_size`, minimum size `batch_size * replay length`. Waits wake on
every insert, sample and release, and report after `run.wait_report` s.

RPC methods served: `ReplayRole.RPC`. Called: logger `add` (replay metrics).

Started as its own command (`--script parallel_replay`), the replay exits
with 69 (unreachable) or 77 (refused) when it cannot reach the logger (the
main run) for run.connect_timeout, and with 0 on the main run's
`stop('exit')`.
"""

import collections
import functools
import multiprocessing
import threading
import time

import elements
import numpy as np

import embodied
from embodied import rpc
from embodied.core import limiters
from embodied.core import replay as replaylib
from embodied.run import arguments
from embodied.run.parallel import roles
from embodied.run.parallel import replay_files
from embodied.run import reporting
from embodied.run import saving
from embodied.run.parallel import connections
from embodied.run.parallel import control
from embodied.run.reporting import prefix


class ReplayRole(control.RoleControl):
    """The replay process's logic; each RPC method is a method of the same
    name. Methods run on the server's threads, one per method at a time:
    inserts, updates and saves exclude each other under `lock`; limiter
    waits wake on `changed`. `checkpoint` must be set before `save`, and
    `on_exit` (what ends the process) before `stop('exit')`. Stop stages:
    'release' (every wait ends), 'exit'."""

    ROLE = 'replay'
    STAGES = roles.stage_names(ROLE)
    RPC = {  # Its RPC methods: who calls each.
        'add_batch': 'actor', 'sample_batch_train': 'learner',
        'sample_batch_report': 'learner', 'sample_batch_eval': 'learner',
        'update': 'learner', **control.RoleControl.RPC}

    def __init__(self, replay_train, replay_eval, make_stream, args):
        self.replay_train = replay_train
        self.replay_eval = replay_eval
        self.batch_size = args.batch_size
        self.batch_length = args.batch_length
        self.report_every = args.wait_report
        self.stream_train = iter(make_stream(replay_train, 'train'))
        self.stream_report = iter(make_stream(replay_train, 'report'))
        self.stream_eval = iter(make_stream(replay_eval, 'eval'))
        self.limiter = limiters.SamplesPerInsert(
            args.train_ratio / args.batch_length,
            tolerance=4 * args.batch_size,
            minsize=args.batch_size * replay_train.length)
        self.checkpoint = None
        self.on_exit = None
        self.released = threading.Event()
        self.draining = threading.Event()  # See `drain`.
        self.lock = threading.Lock()  # Keeps saves apart from inserts and updates.
        # Notified after inserts, samples and the release, so that limiter
        # waits wake at once instead of at their next poll (`limiters.wait`).
        self.changed = threading.Condition()
        # A waiting insert waits for room for this many rows (or its last
        # ones), so it goes on in few large steps, not one per sampled
        # batch; samples wake it only once there is that room (`insert_need`).
        self.insert_group = max(1, int(self.limiter.tolerance // 2))
        self.insert_need = 0
        self.counts = collections.Counter()
        self.sums = {}  # Limiter wait seconds since the last metrics.
        self.sums_lock = threading.Lock()
        # Batches into the learner's slots.
        self.producer = rpc.replay_to_learner.Producer()
        self._train_layout = functools.partial(
            embodied.streams.layout, self.stream_train)
        self._sample_train_into = lambda views: self._sample_train(
            lambda: embodied.streams.next_into(self.stream_train, views))
        self.logged = {'inserts': 0.0, 'insert_waits': 0.0}

    # RPC methods.

    def add_batch(self, data):
        """Eval rows go to the eval replay; train rows to the train replay,
        as many at a time as the limiter allows."""
        replay_train, limiter, counts = (
            self.replay_train, self.limiter, self.counts)
        envids = data.pop('envid')
        is_eval = data.pop('is_eval').astype(bool)
        if is_eval.any():
            rows = np.flatnonzero(is_eval)
            with self.lock:
                replaylib.add_rows(self.replay_eval,
                         {k: v[rows] for k, v in data.items()},
                         envids[rows].tolist())
            self._notify()
            counts['eval_inserts'] += len(rows)
            rows = np.flatnonzero(~is_eval)
            data = {k: v[rows] for k, v in data.items()}
            envids = envids[rows]
        envids = envids.tolist()
        done = 0
        while done < len(envids):
            need = min(len(envids) - done, self.insert_group)
            self.insert_need = need  # Before the wait checks: see _sampled.
            with elements.timer.section('replay_insert_wait'):
                dur = self._wait(lambda: self._may_insert(need),
                                 'Replay insert is waiting', limiter.state)
            self.insert_need = 0
            # Released at shutdown: insert anyway, so replay and logger agree.
            released = dur is None
            dur = dur or 0.0
            self._wait_sum('insert_wait_dur', dur)
            counts['insert_wait_seconds'] += dur
            counts['insert_waits'] += dur > 0
            with self.lock:  # As many as the limiter allows in one go.
                before, rest = limiter.size, len(envids) - done
                if released or self._unlimited():
                    limiter.insert(rest)
                    stop = len(envids)
                else:
                    stop = done + limiter.try_insert(rest)
                counts['inserts_after_minsize'] += max(
                    0, limiter.size - max(before, limiter.minsize))
                replaylib.add_rows(replay_train,
                         {k: v[done:stop] for k, v in data.items()},
                         envids[done:stop])
            counts['inserts'] += stop - done
            done = stop
            self._notify()
        return {}

    def sample_batch_train(self, target=None):
        """One batch once the limiter allows; with a `target` (the learner's
        shared-memory slots, see `rpc.replay_to_learner`), one batch per
        slot, made there by the stream where it can (`layout`, `next_into`:
        one copy from the replay's chunks), answered by a slot reply each. None
        when released."""
        return self.producer.answer(
            target, self._sample_train, self._train_layout,
            self._sample_train_into)

    def sample_batch_report(self):
        """A batch of the train replay once it has data; None when released."""
        return self._sample_from(self.replay_train, self.stream_report, 'report')

    def sample_batch_eval(self):
        """A batch of the eval replay once it has data; None when released."""
        return self._sample_from(self.replay_eval, self.stream_eval, 'eval')

    def update(self, data):
        """Replay context from agent.train."""
        with self.lock:
            self.replay_train.update(data)

    def status(self):
        counts = self.counts
        ratio = counts['samples'] * self.batch_length / max(
            1, counts['inserts_after_minsize'])
        return {
            **{k: float(v) for k, v in counts.items()},
            'size': len(self.replay_train), 'eval_size': len(self.replay_eval),
            'minsize': self.limiter.minsize, 'train_ratio': ratio,
        }

    def save(self, tag):
        """Saves replays and limiter under `tag`; prunes unused chunk files."""
        with self.lock:
            self.checkpoint.save(int(tag))
        for entry, replay in (('replay', self.replay_train),
                              ('replay_eval', self.replay_eval)):
            try:
                replay_files.prune(getattr(replay, 'directory', None),
                                   self.checkpoint.directory, entry,
                                   getattr(self.checkpoint, 'trust_pickle',
                                           False))
            except OSError as e:
                print(f'Could not delete old {entry} chunk files: {e}',
                      flush=True)
        return int(tag)

    def quiesce(self):
        """A save drains the actor: the replay takes what is on its way."""
        return self.drain(True)

    def resume(self):
        self.drain(False)

    def _stop_release(self):
        self.release()

    def _stop_exit(self):
        self.on_exit()

    # For the process and the stop.

    def drain(self, on):
        """While on (a save drains the actor), inserts skip the limiter:
        the rows on their way arrive at once, not as the learner makes room
        (the limiter still counts them, so the ratio holds over time)."""
        (self.draining.set if on else self.draining.clear)()
        self._notify()
        return bool(on)

    def release(self):
        """Ends every wait: inserts skip the limiter, samples answer None."""
        self.released.set()
        self._notify()

    def metrics(self):
        """The periodic metrics: limiter, counts, replay stats."""
        current = self.status()
        stats = {}
        stats.update(reporting.timer_metrics('timer/replay'))
        with self.sums_lock:
            sums, self.sums = self.sums, {}
        stats.update(prefix(sums, 'limiter'))
        now = {key: current.get(key, 0.0) for key in self.logged}
        if now['inserts'] != self.logged['inserts']:
            stats['limiter/insert_wait_frac'] = (
                now['insert_waits'] - self.logged['insert_waits']) / (
                now['inserts'] - self.logged['inserts'])
        self.logged = now
        stats['limiter/train_ratio'] = current['train_ratio']
        for key in ('inserts', 'eval_inserts', 'samples'):
            stats[f'parallel_replay/{key}'] = current.get(key, 0.0)
        stats.update(prefix(self.replay_train.stats(), 'replay'))
        stats.update(prefix(self.replay_eval.stats(), 'replay_eval'))
        return stats

    def close(self):
        """Ends every wait and closes the replays (not `producer`: a
        sample in flight may still write to it until the server closed)."""
        self.release()
        for replay in (self.replay_train, self.replay_eval):
            hasattr(replay, 'close') and replay.close()

    def _wait(self, predicate, message, info=None):
        try:
            return limiters.wait(
                predicate, message, info, self.report_every, self.released,
                self.changed)
        except limiters.Released:
            return None

    def _notify(self):
        with self.changed:
            self.changed.notify_all()

    def _may_insert(self, rows=1):
        return self._unlimited() or self.limiter.want_insert(rows)

    def _unlimited(self):
        """Whether inserts skip the limiter (still counted by it): while a
        save drains (`drain`), and while the replay is empty. The limiter's
        minsize counts inserts, but a sequence needs `length` steps of one
        env: with many envs the replay can still be empty, a sampler then
        waits for data, and inserts must not wait for it."""
        return self.draining.is_set() or not len(self.replay_train)

    def _sampled(self):
        """Wakes a waiting insert once the samples made room for it. An
        insert sets `insert_need` before it checks, and samples change the
        limiter before they read it, so no wake-up is missed."""
        need = self.insert_need
        if need and self._may_insert(need):
            self._notify()

    def _sample_train(self, sample=None):
        """The next train batch once the limiter allows, from `sample()`
        if given, else from the train stream. None when released."""
        limiter, counts = self.limiter, self.counts
        start = time.monotonic()
        with elements.timer.section('replay_sample_wait'):
            needed = self.batch_size
            while needed:
                dur = self._wait(limiter.want_sample,
                                 'Replay sample is waiting', limiter.state)
                if dur is None:
                    return None  # Shutting down; the learner stops on None.
                needed -= limiter.try_sample(needed)
                self._sampled()  # The samples may let a waiting insert go on.
        # The limiter counts inserts of all envs: with more envs than
        # batch_size it can allow samples before any sequence is complete.
        replay = self.replay_train
        if self._wait(lambda: len(replay) > 0, 'Replay train is waiting '
                      'for its first sequence', lambda: {
                          'items': len(replay),
                          'inserts': limiter.size}) is None:
            return None
        waited = time.monotonic() - start
        self._wait_sum('sample_wait_dur', waited)
        counts['sample_wait_seconds'] += waited
        counts['samples'] += self.batch_size
        # The replay is thread-safe.
        return sample() if sample else next(self.stream_train)

    def _wait_sum(self, key, seconds):
        # Summed here and read by `metrics`: an `elements.Agg.add` per batch
        # was a tenth of the process's CPU.
        with self.sums_lock:
            self.sums[key] = self.sums.get(key, 0.0) + seconds

    def _sample_from(self, replay, stream, what):
        if self._wait(lambda: len(replay) > 0,
                      f'Replay {what} is waiting') is None:
            return None  # Shutting down; the learner stops on None.
        return next(stream)


# The process: the role behind a server on run.replay_addr.

def resumed_role(make_replay_train, make_replay_eval, make_stream, args):
    """The replay role over fresh replays, resumed from the newest save
    when there is one."""
    replay_train = connections.loads(make_replay_train)()
    replay_eval = connections.loads(make_replay_eval)()
    for replay in (replay_train, replay_eval):
        if hasattr(replay, 'save_wait'):
            replay.save_wait = True  # A checkpoint must not outrun its files.
    role = ReplayRole(
        replay_train, replay_eval, connections.loads(make_stream), args)
    role.checkpoint, tag = saving.resume_role(
        args, 'replay', replay=replay_train, replay_eval=replay_eval,
        limiter=role.limiter)
    if tag is not None:
        print(f'Replay resumed from the save at step {tag} '
              f'({len(replay_train)} items).', flush=True)
    return role


def parallel_replay(make_replay_train, make_replay_eval, make_stream, args):
    """Serves the train and eval replays, enforcing the train ratio."""
    args = arguments.normalize(args)
    role = resumed_role(make_replay_train, make_replay_eval, make_stream, args)
    done = threading.Event()
    # A separate command runs in the main process of its own command line;
    # a launch's replay is a child of the launcher, which watches it.
    separate = multiprocessing.parent_process() is None
    try:
        logger = connections.connect(
            args, 'logger', 'ReplayLogger', separate=separate, maxinflight=4)
    except rpc.Unreachable as e:
        if not separate:
            raise
        role.close()
        print(f'{e} Exiting.', flush=True)
        raise SystemExit(rpc.supervisor.exit_code(e)) from None
    should_log = embodied.LocalClock(args.log_every)
    usage = elements.Usage(**args.usage.update(nvsmi=False))

    def metrics():
        return {**role.metrics(), **prefix(usage.stats(), 'usage/replay'),
                **prefix(server.stats(), 'server/replay')}

    def shutdown():
        logger.add(metrics()).result()  # Arrives before the logger's last write.
        done.set()

    role.on_exit = shutdown
    server = connections.server(args, 'replay', 'Replay')
    connections.bind_role(server, role)
    server.start()
    lost = None  # Since when the logger has been unreachable.
    try:
        while not done.wait(0.5):
            if separate and not logger.connected:
                lost = lost or time.monotonic()
                if time.monotonic() - lost > args.connect_timeout:
                    print(f'Replay: no logger at {args.logger_addr} for '
                          f'{args.connect_timeout} s (run.connect_timeout): '
                          f'the main run has ended. Exiting.', flush=True)
                    raise SystemExit(rpc.supervisor.EXIT_UNREACHABLE)
                continue
            lost = None
            if should_log():
                logger.add(metrics())
    finally:
        role.close()
        server.close()
        role.producer.close()
        logger.close(1)
    return 0
