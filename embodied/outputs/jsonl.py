"""JSONL metrics with a wall-time column."""

import collections
import json
import re
import time

import elements
import numpy as np


class JSONLOutput(elements.logger.AsyncOutput):
    """Appends one JSON line per step with the scalars logged at that step,
    like elements' JSONLOutput, and a `time` column: seconds since this
    output was created (the start of the launch).

    The logger writes in bursts (every `run.log_every`), so the lines of one
    write get times interpolated by step between the previous write (at
    first: step 0 at time 0) and this one, whose largest step (the logger's
    step when it wrote) gets the time of the write. A resumed run starts
    again from 0; `embodied.plot` chains the launches.
    """

    def __init__(self, logdir, filename='metrics.jsonl', pattern=r'.*',
                 parallel=True):
        super().__init__(self._write, parallel)
        self._pattern = re.compile(pattern)
        logdir = elements.Path(logdir)
        logdir.mkdir()
        self._filename = logdir / filename
        self._start = time.monotonic()
        self._anchor = (0, 0.0)  # (step, seconds) of the previous write.

    def _write(self, summaries):
        now = time.monotonic() - self._start
        latest = max(step for step, _, _ in summaries)
        times = self._times(latest, now)
        rows = collections.defaultdict(dict)
        for step, name, value in summaries:
            if not self._pattern.search(name):
                continue
            if not isinstance(value, str) and np.ndim(value) == 0:
                rows[step][name] = float(value)
        lines = ''.join(
            json.dumps({'step': step, 'time': round(times(step), 3), **row})
            + '\n' for step, row in rows.items())
        if lines:
            with self._filename.open('a') as f:
                f.write(lines)

    def _times(self, latest, now):
        """Maps a step of this write to its estimated time."""
        last_step, last_time = self._anchor
        self._anchor = (latest, now)
        if latest <= last_step:
            return lambda step: now
        span = latest - last_step

        def estimate(step):
            fraction = min(1.0, max(0.0, (step - last_step) / span))
            return last_time + fraction * (now - last_time)
        return estimate
