"""bsuite, the Behaviour Suite for RL: tasks `bsuite_<experiment>/<setting>`,
e.g. `bsuite_mnist/0`, `bsuite_catch/3`, `bsuite_deep_sea/0` (a task
without `/<setting>` is setting 0).

bsuite is imported only when an env is built. Each env can write bsuite's
CSV results (the file bsuite's own analysis reads) and continues them when
the run resumes, see `Results`.
"""

import csv
import difflib
import json
import os
import pathlib

import elements
import numpy as np

from embodied.core import base
from embodied.envs import from_dm
from embodied.envs import packages

# bsuite logs an episode's results at these multiples of each power of ten.
LOG_RATIOS = (1, 1.2, 1.4, 1.7, 2, 2.5, 3, 4, 5, 6, 7, 8, 9)
COUNTS = ('steps', 'episode', 'total_return')


class BSuite(base.Env):
    """One bsuite experiment setting, as bsuite's `load_from_id` builds it.

    Observation `observation` (float32, 2-D observations flattened to a
    vector), discrete `action`. With `results` and a `logdir`, the results
    of the experiment's `bsuite_num_episodes` episodes go to
    `logdir/bsuite/` (see `Results`).
    """

    def __init__(self, task, results=True, logdir=None):
        bsuite = packages.need('bsuite', f'bsuite_{task}', 'bsuite')
        from bsuite import sweep
        bsuite_id = task if '/' in task else f'{task}/0'
        if bsuite_id not in sweep.SETTINGS:
            close = difflib.get_close_matches(bsuite_id, sweep.SWEEP, n=3)
            hint = f" Close matches: {', '.join(close)}." if close else ''
            raise ValueError(f"Unknown bsuite task '{bsuite_id}'.{hint}")
        try:
            self._raw = bsuite.load_from_id(bsuite_id)
        except OSError as e:
            raise RuntimeError(
                f'BSuite {bsuite_id}: loading failed: {e}. The mnist tasks '
                f'download MNIST into /tmp/mnist on first use; without a '
                f'network, put its four .gz files there.') from e
        self.bsuite_id = bsuite_id
        self.max_episodes = int(self._raw.bsuite_num_episodes)
        self._env = from_dm.FromDM(self._raw, obs_key='observation')
        self._flat = {
            key: space for key, space in self._env.obs_space.items()
            if len(space.shape) == 2}
        self._results = None
        if results and logdir:
            self._results = Results(
                bsuite_id, self._raw, pathlib.Path(str(logdir)) / 'bsuite')

    @property
    def obs_space(self):
        spaces = dict(self._env.obs_space)
        for key, space in self._flat.items():
            spaces[key] = elements.Space(
                space.dtype, (int(np.prod(space.shape)),),
                np.asarray(space.low).flatten(),
                np.asarray(space.high).flatten())
        return spaces

    @property
    def act_space(self):
        return self._env.act_space

    def step(self, action):
        obs = self._env.step(action)
        for key in self._flat:
            obs[key] = obs[key].reshape(-1)
        if self._results:
            self._results.track(obs)
        return obs

    def close(self):
        self._env.close()


class Results:
    """bsuite's results of one env: a CSV row at bsuite's logging episodes
    (1, 2, ... 10, 12, 14, 17, 20, 25, ... of each power of ten) with the
    counts `steps`, `episode`, `total_return`, the last episode's
    `episode_len` and `episode_return`, and the experiment's
    `bsuite_info()` totals; in `folder/bsuite_id_-_<id>.csv`, the name and
    columns bsuite's `csv_load.load_bsuite(folder)` reads.

    A run stopped and resumed continues them: the counts and totals after
    each finished episode are kept in `folder/state.json`, and an env made
    on a folder that has them (the resumed run's) starts from them. The
    episode the stop cut short is not counted; rows past the kept state
    (a stop between the two writes) are dropped.
    """

    def __init__(self, bsuite_id, env, folder):
        self.env = env
        self.folder = pathlib.Path(folder)
        name = bsuite_id.replace('/', '-')
        self.path = self.folder / f'bsuite_id_-_{name}.csv'
        self.state_path = self.folder / 'state.json'
        self.counts = dict(steps=0, episode=0, total_return=0.0)
        self.episode_len = 0
        self.episode_return = 0.0
        self.resumed = False
        self.folder.mkdir(parents=True, exist_ok=True)
        if self.state_path.exists():
            self._restore(json.loads(self.state_path.read_text()))

    def track(self, obs):
        """Counts one step of the env and writes what an episode's end
        brings (a row, the state)."""
        if obs['is_first']:
            self.episode_len, self.episode_return = 0, 0.0
            if self.resumed:
                print(f'BSuite {self.path.name}: continuing the results at '
                      f'episode {self.counts["episode"]} ({self.folder}).')
                self.resumed = False
            return
        self.counts['steps'] += 1
        self.episode_len += 1
        self.episode_return += float(obs['reward'])
        self.counts['total_return'] += float(obs['reward'])
        if not obs['is_last']:
            return
        self.counts['episode'] += 1
        episode = self.counts['episode']
        if episode > self.env.bsuite_num_episodes:
            return
        if logged(episode):
            self._write_row()
        self._save_state()
        if episode == self.env.bsuite_num_episodes:
            print(f'BSuite: all {episode} episodes of {self.path.name} are '
                  f'done; its results in {self.folder} are complete.')

    def rows(self):
        """The CSV's rows as dicts of strings."""
        if not self.path.exists():
            return []
        with self.path.open() as f:
            return list(csv.DictReader(f))

    def _row(self):
        info = {k: _plain(v) for k, v in self.env.bsuite_info().items()}
        return {**self.counts, 'episode_len': self.episode_len,
                'episode_return': self.episode_return, **info}

    def _write_row(self):
        row = self._row()
        new = not self.path.exists()
        with self.path.open('a') as f:
            writer = csv.DictWriter(f, fieldnames=list(row))
            if new:
                writer.writeheader()
            writer.writerow(row)

    def _save_state(self):
        info = {k: _plain(v) for k, v in self.env.bsuite_info().items()}
        state = {**self.counts, 'info': info}
        temp = self.folder / 'state.json.tmp'
        temp.write_text(json.dumps(state))
        os.replace(temp, self.state_path)

    def _restore(self, state):
        for key, value in state['info'].items():
            # bsuite keeps each bsuite_info() value in the attribute _<key>.
            if not hasattr(self.env, f'_{key}'):
                raise RuntimeError(
                    f'BSuite: cannot continue the results in {self.folder}: '
                    f'the env has no attribute _{key} for its saved {key}.')
            setattr(self.env, f'_{key}', value)
        self.counts = {key: state[key] for key in COUNTS}
        self.resumed = True
        rows = self.rows()
        kept = [r for r in rows if int(r['episode']) <= state['episode']]
        if len(kept) < len(rows):
            with self.path.open('w') as f:
                writer = csv.DictWriter(f, fieldnames=list(rows[0]))
                writer.writeheader()
                writer.writerows(kept)


def logged(episode):
    """Whether bsuite logs the results after this episode."""
    power = 10 ** int(np.floor(np.log10(max(1, episode))))
    return any(episode == power * ratio for ratio in LOG_RATIOS)


def _plain(value):
    value = np.asarray(value)
    return value.item() if value.ndim == 0 else value.tolist()
