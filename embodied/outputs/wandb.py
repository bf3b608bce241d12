"""A Weights & Biases run as a logger output (`--logger.outputs wandb`)."""

import collections
import io
import json
import os

import elements
import numpy as np

from embodied.config import UsageError
from . import gif

INSTALL = "pip install 'embodied[wandb]'"
STATE_FILE = 'wandb.json'


class WandBOutput(elements.logger.AsyncOutput):
    """Sends the logger's metrics to a W&B run: scalars, text, histograms
    (1-D), images (2-D and 3-D) and videos (4-D, e.g. the episodes'
    `epstats/policy_image`) as GIFs at `fps`, at the logger's step.
    Several values of one name at one step: W&B keeps the last.

    The run's id is kept in `logdir/wandb.json`, so a launch on the same
    logdir continues the same W&B run (`resume='allow'`). W&B's steps only
    go forward: a resumed launch does not send the steps that an earlier
    launch sent already (those after the save it resumed from). `project`,
    `entity`, `group` and `name` that are empty are left to W&B
    (`WANDB_PROJECT`, ...). W&B's files go into `logdir/wandb` unless
    `WANDB_DIR` says otherwise. `close()` finishes the run."""

    def __init__(self, logdir, config=None, project='', entity='', group='',
                 name='', fps=15, parallel=True):
        super().__init__(self._write, parallel)
        self._wandb = _import()
        self._state = elements.Path(logdir) / STATE_FILE
        state = _read_state(self._state)
        self._before = state.get('step', -1)  # Sent by earlier launches.
        self._sent = self._before
        self._told = False
        self._fps = fps
        kwargs = dict(
            id=state.get('id'), resume='allow', project=project or None,
            entity=entity or None, group=group or None, name=name or None,
            config=config)
        if not os.environ.get('WANDB_DIR') and '://' not in str(logdir):
            os.makedirs(str(logdir), exist_ok=True)
            kwargs['dir'] = str(logdir)
        try:
            self._run = self._wandb.init(**kwargs)
        except self._wandb.errors.UsageError as e:
            raise UsageError(
                f'logger.outputs wandb: {e} Or set WANDB_MODE=offline to '
                f'keep the run in the logdir and upload it later with '
                f'`wandb sync`.') from None
        self._save()

    @property
    def run_id(self):
        return self._run.id

    def close(self):
        """Sends what is queued, finishes the W&B run and waits for W&B's
        service process to write it out: a process that exits right after
        `finish()` may otherwise take the service down (a run's processes
        are ended together) before it wrote the run's file."""
        self.wait()
        self._run.finish()
        self._wandb.teardown()

    def _write(self, summaries):
        rows = collections.defaultdict(dict)
        skipped = False
        for step, name, value in summaries:
            if step <= self._before:
                skipped = True
                continue
            value = self._value(name, value)
            if value is not None:
                rows[int(step)][name] = value
        for step in sorted(rows):
            self._run.log(rows[step], step=step)
        if skipped and not self._told:
            self._told = True
            print(f'W&B: run {self._run.id} has the steps up to '
                  f'{self._before} from an earlier launch; this launch '
                  f'sends the steps after them.', flush=True)
        if rows and max(rows) > self._sent:
            self._sent = max(rows)
            self._save()

    def _value(self, name, value):
        wandb = self._wandb
        if isinstance(value, str):
            return value
        if value.ndim == 0:
            return float(value)
        if value.ndim == 1:
            value = value[np.isfinite(value.astype(np.float64))]
            return wandb.Histogram(value) if value.size else None
        if value.ndim in (2, 3):
            if value.ndim == 3 and value.shape[-1] not in (1, 3, 4):
                raise ValueError(
                    f"W&B: metric '{name}' has shape {value.shape}; an image "
                    f"needs 1, 3 or 4 channels last.")
            image = gif.to_uint8(value[None])[0]
            return wandb.Image(image[..., 0] if image.shape[-1] == 1 else image)
        if value.ndim == 4 and len(value):
            data = io.BytesIO(gif.encode(value, self._fps))
            return wandb.Video(data, format='gif')
        return None

    def _save(self):
        text = json.dumps({'id': self._run.id, 'step': self._sent})
        tmp = self._state.parent / (self._state.name + '.tmp')
        tmp.write(text)
        tmp.move(self._state)


def run_config(config):
    """`config` (an elements.Config) as the nested dict W&B shows as the
    run's config, without the run's secret."""
    flat = dict(config.flat)
    if flat.get('run.secret'):
        flat['run.secret'] = '(hidden)'
    nested = {}
    for key, value in flat.items():
        *parents, leaf = key.split('.')
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = list(value) if isinstance(value, tuple) else value
    return nested


def _read_state(path):
    """{'id': the W&B run id, 'step': the largest step sent} of earlier
    launches, or {}."""
    if not path.exists():
        return {}
    try:
        state = json.loads(path.read())
    except ValueError:
        raise ValueError(
            f'{path} is not the JSON this output writes; remove it to start '
            f'a new W&B run.') from None
    return state if isinstance(state, dict) else {}


def _import():
    try:
        import wandb
    except ImportError:
        raise ImportError(
            f'The wandb logger output needs wandb: {INSTALL}') from None
    return wandb
