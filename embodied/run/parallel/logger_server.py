"""The logger process: counts the global step and writes metrics.

    tran(transitions)   step += train rows; episode statistics per env
    add(metrics)        from the learner and the replay
    abandon(envids)     drops the unfinished episodes of a crashed worker
    every run.log_every: write aggregated metrics (jsonl, terminal, ...)

The step is the number of train env steps; the launcher reads it (`status`)
to decide `run.steps` and to tag every save.

RPC methods served: `tran`, `add`, `abandon`, `status`, `save`, `shutdown`.
"""

import collections
import threading
import time

import elements

import embodied
from embodied import rpc
from embodied.run import arguments
from embodied.run import episodes as episodeslib
from embodied.run import saving
from embodied.run import wiring


@elements.timer.section('logger')
def parallel_logger(make_logger, args):
    """Counts the global step (train env steps), aggregates episodes and
    writes metrics."""
    args = arguments.normalize(args)
    logger = wiring.loads(make_logger)()
    step = logger.step
    lock = threading.Lock()
    episodes = {
        False: episodeslib.EpisodeStats(logger, 'episode'),
        True: episodeslib.EpisodeStats(logger, 'eval_episode')}
    parallel = elements.Agg()
    updated = {}
    counts = collections.Counter()

    cp, tag = saving.resume_role(args, 'logger', step=step)
    if tag is not None:
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

    def drop_stale():
        """Drops the episodes of envs silent for run.episode_timeout (called
        with the periodic write, not per request)."""
        now = time.monotonic()
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
        with lock:  # `tran` adds scores meanwhile.
            score = episodes[False].recent_score()
        return {'step': int(step), 'env_steps': counts['env_steps'],
                'score': score}

    def save(tag):
        with lock:
            cp.save(int(tag))
        return int(tag)

    def write():
        with lock:
            drop_stale()
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

