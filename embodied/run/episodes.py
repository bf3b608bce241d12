"""Per-episode statistics from a stream of transitions, shared by the runners."""

import collections

import elements
import numpy as np


class EpisodeStats:
    """Aggregates transitions per worker into episode score, length and the
    `log/` metrics of the env, and writes them to a logger when an episode
    ends. `result()` gives the aggregates over the episodes since last call.

        stats = EpisodeStats(logger)
        driver.on_step(stats.add)      # add(tran, worker)
        logger.add(stats.result(), prefix='epstats')
    """

    def __init__(self, logger, prefix='episode', video_worker=0):
        self.logger = logger
        self.prefix = prefix
        self.video_worker = video_worker
        self.episodes = collections.defaultdict(elements.Agg)
        self.epstats = elements.Agg()

    def add(self, tran, worker=0):
        episode = self.episodes[worker]
        if tran['is_first']:
            episode.reset()
        episode.add('score', tran['reward'], agg='sum')
        episode.add('length', 1, agg='sum')
        episode.add('rewards', tran['reward'], agg='stack')
        for key, value in tran.items():
            value = np.asarray(value)
            if value.dtype == np.uint8 and value.ndim == 3:
                if worker == self.video_worker:
                    episode.add(f'policy_{key}', value, agg='stack')
            elif key.startswith('log/'):
                if value.ndim != 0:
                    raise ValueError(
                        f"Env metric '{key}' must be a scalar, got shape "
                        f"{value.shape} ({value.dtype}).")
                episode.add(key + '/avg', value, agg='avg')
                episode.add(key + '/max', value, agg='max')
                episode.add(key + '/sum', value, agg='sum')
        if tran['is_last']:
            self._finish(worker)

    def drop(self, worker):
        """Forgets an unfinished episode (its env went away)."""
        self.episodes.pop(worker, None)

    def result(self):
        return self.epstats.result()

    def _finish(self, worker):
        result = self.episodes.pop(worker).result()
        self.logger.add({
            'score': result.pop('score'),
            'length': result.pop('length') - 1,
        }, prefix=self.prefix)
        rewards = result.pop('rewards')
        if len(rewards) > 1:
            result['reward_rate'] = (
                np.abs(rewards[1:] - rewards[:-1]) >= 0.01).mean()
        self.epstats.add(result)
