"""Per-episode statistics from a stream of transitions, shared by the runners."""

import collections

import elements
import numpy as np


class EpisodeStats:
    """Aggregates transitions per worker into episode score, length and the
    `log/` metrics of the env (and, for one worker, its images as videos),
    and writes them to a logger when an episode ends. `result()` gives the
    aggregates over the episodes since last call.

        stats = EpisodeStats(logger)
        driver.on_step(stats.add)      # add(tran, worker)
        logger.add(stats.result(), prefix='epstats')
        stats.recent_score()           # mean score of the latest episodes
    """

    def __init__(self, logger, prefix='episode', video_worker=0, recent=20):
        self.logger = logger
        self.prefix = prefix
        self.video_worker = video_worker
        self.episodes = {}
        self.epstats = elements.Agg()
        self.scores = collections.deque(maxlen=recent)

    def add(self, tran, worker=0):
        if tran['is_first'] or worker not in self.episodes:
            self.episodes[worker] = _Episode()
        episode = self.episodes[worker]
        episode.rewards.append(float(tran['reward']))
        for key, value in tran.items():
            # Images (also `log/image`) become videos; other `log/` keys are
            # scalar metrics.
            if is_image(value):
                if worker == self.video_worker:
                    episode.frames[key].append(value)
            elif key.startswith('log/'):
                if np.ndim(value) != 0:
                    raise ValueError(
                        f"Env metric '{key}' must be a scalar or a uint8 "
                        f"(H, W, C) image, got shape {np.shape(value)} "
                        f"({np.asarray(value).dtype}).")
                episode.logs[key].append(float(value))
        if tran['is_last']:
            self._finish(worker)

    def add_batch(self, trans, workers):
        """Steps of several workers at once: `trans` holds arrays whose
        first axis is the row of `workers[i]`; the same as `add` per row,
        with the per-key decisions taken once per batch."""
        images, logs = [], []
        for key, value in trans.items():
            value = np.asarray(value)
            if value.ndim == 4 and is_image(value[0]):
                images.append(key)
            elif key.startswith('log/'):
                if value.ndim != 1:
                    raise ValueError(
                        f"Env metric '{key}' must be a scalar or a uint8 "
                        f"(H, W, C) image, got shape {value.shape[1:]} "
                        f"({value.dtype}).")
                logs.append(key)
        firsts = np.asarray(trans['is_first']).tolist()
        lasts = np.asarray(trans['is_last']).tolist()
        rewards = np.asarray(trans['reward'], np.float64).tolist()
        columns = [(key, np.asarray(trans[key], np.float64).tolist())
                   for key in logs]
        for i, worker in enumerate(workers):
            if firsts[i] or worker not in self.episodes:
                self.episodes[worker] = _Episode()
            episode = self.episodes[worker]
            episode.rewards.append(rewards[i])
            if worker == self.video_worker:
                for key in images:
                    episode.frames[key].append(trans[key][i])
            for key, column in columns:
                episode.logs[key].append(column[i])
            if lasts[i]:
                self._finish(worker)

    def drop(self, worker):
        """Forgets an unfinished episode (its env went away)."""
        self.episodes.pop(worker, None)

    def result(self):
        return self.epstats.result()

    def recent_score(self):
        """The mean score of the latest `recent` finished episodes (NaN
        scores left out), or NaN before any."""
        kept = [x for x in self.scores if not np.isnan(x)]
        return float(np.mean(kept)) if kept else float('nan')

    def _finish(self, worker):
        episode = self.episodes.pop(worker)
        rewards = np.asarray(episode.rewards, np.float64)
        score = _nansum(rewards)
        self.scores.append(float(score))
        self.logger.add({
            'score': score,
            'length': np.float64(len(rewards) - 1),
        }, prefix=self.prefix)
        result = {}
        if len(rewards) > 1:
            result['reward_rate'] = (
                np.abs(rewards[1:] - rewards[:-1]) >= 0.01).mean()
        for key, values in episode.logs.items():
            values = np.asarray(values, np.float64)
            kept = values[~np.isnan(values)]
            empty = not len(kept)
            result[key + '/avg'] = np.nan if empty else kept.mean()
            result[key + '/max'] = np.nan if empty else kept.max()
            result[key + '/sum'] = np.nan if empty else kept.sum()
        for key, frames in episode.frames.items():
            result[f'policy_{key}'] = np.stack(frames)
        self.epstats.add(result)


class _Episode:
    """What one running episode has collected so far."""

    __slots__ = ('rewards', 'logs', 'frames')

    def __init__(self):
        self.rewards = []
        self.logs = collections.defaultdict(list)
        self.frames = collections.defaultdict(list)


def _nansum(values):
    """The sum of the values that are not NaN (NaN when all are)."""
    kept = values[~np.isnan(values)]
    return np.float64(kept.sum()) if len(kept) else np.float64(np.nan)


def is_image(value):
    """Whether `value` is one uint8 frame (H, W, 1|3|4): a video frame."""
    return (getattr(value, 'dtype', None) == np.uint8 and value.ndim == 3
            and value.shape[-1] in (1, 3, 4))
