"""Small helpers shared by several test modules."""

import json
import subprocess
import sys
import threading

import elements
import numpy as np
from PIL import Image

from embodied.core import limiters

# A small vector task with two discrete actions, for building agents.
OBS_SPACE = {
    'vector': elements.Space(np.float32, (4,)),
    'reward': elements.Space(np.float32),
    'is_first': elements.Space(bool),
    'is_last': elements.Space(bool),
    'is_terminal': elements.Space(bool),
}
ACT_SPACE = {'action': elements.Space(np.int32, (), 0, 2)}

# The single-process and the parallel training script, each with flags for a
# short run: `@pytest.mark.parametrize('script, flags', SCRIPTS)`.
SCRIPTS = [
    ('train', []),
    ('parallel', ['--run.envs_per_worker', '2', '--run.eval_envs', '0']),
]


def gif_frames(source):
    """The RGB frames of a GIF, from a path or a binary file object."""
    with Image.open(source) as image:
        assert image.format == 'GIF'
        frames = []
        for index in range(image.n_frames):
            image.seek(index)
            frames.append(np.asarray(image.convert('RGB')))
    return frames


def released_error(blocked, release):
    """Calls `blocked()` in a thread, then `release()`; returns the
    `limiters.Released` that `blocked()` raised, after checking that the
    thread ended and raised exactly that."""
    errors = []

    def target():
        try:
            blocked()
        except limiters.Released as e:
            errors.append(e)
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    release()
    thread.join(timeout=10)
    assert not thread.is_alive(), 'still blocked after the release'
    assert len(errors) == 1, errors
    return errors[0]


class LockedCheckpoint:
    """A checkpoint stand-in for a role's `save`: records each tag saved and
    checks that `lock` was held meanwhile."""

    def __init__(self, lock, directory=None):
        self.lock = lock
        self.directory = directory
        self.saved = []

    def save(self, tag):
        assert self.lock.locked(), 'saved without holding the lock'
        self.saved.append(tag)


def wandb_offline_runs(logdir, env=None):
    """The W&B offline runs in `logdir/wandb`, oldest first, each as (run
    record, {step: history row}, run folder), read with wandb's own reader
    of `.wandb` files (`wandb leet inspect --json`). Fails for a run that
    was not finished (no exit record)."""
    runs = []
    for folder in sorted((logdir / 'wandb').glob('offline-run-*')):
        result = subprocess.run(
            [sys.executable, '-m', 'wandb', 'leet', 'inspect', '--json',
             str(folder)], capture_output=True, text=True, timeout=120,
            env=env)
        assert result.returncode == 0, result.stderr[-3000:]
        records = [json.loads(line) for line in result.stdout.splitlines()]
        run = next(r['run'] for r in records if r['type'] == 'run')
        history = {}
        for record in records:
            if record['type'] == 'history':
                row = record['history']
                history[row['step']['num']] = row['item']
        assert any(r['type'] == 'exit' for r in records), (
            f'{folder}: the run was not finished')
        runs.append((run, history, folder))
    return runs
