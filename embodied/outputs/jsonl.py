"""JSONL metrics with a wall-time column."""

import json
import os
import re
import time

import elements
import numpy as np

from embodied.core import diskfull


class JSONLOutput(elements.logger.AsyncOutput):
    """Appends one JSON line per step with the scalars logged at that step,
    like elements' JSONLOutput, and a `time` column: wall seconds the run
    has been going, summed over its launches (a resumed run continues from
    the last `time` in the file).

    The logger writes in bursts (every `run.log_every`), so the lines of one
    write get times interpolated by step between the previous write (at
    first: the file's last line, or step 0 at time 0) and this one, whose
    largest step (the logger's step when it wrote) gets the time of the
    write.

    A run that resumes from a save rolls its step back to the save's step,
    and the lines written after that save describe steps it will take
    again: `rewind(step)` (called on resume) moves them to
    `<name>.rewound.jsonl` next to the file, so the file's steps never go
    back and nothing written is thrown away.
    """

    def __init__(self, logdir, filename='metrics.jsonl', pattern=r'.*',
                 parallel=True):
        super().__init__(self._write, parallel)
        self._pattern = re.compile(pattern)
        logdir = elements.Path(logdir)
        logdir.mkdir()
        self._filename = logdir / filename
        self._start = time.monotonic()
        # (step, seconds) of the previous write.
        self._anchor = _last_step_and_time(str(self._filename))
        self._base = self._anchor[1]
        # A line cut short by a crash is ended, not continued.
        self._newline = _ends_mid_line(str(self._filename))

    def rewind(self, step):
        """Moves the lines of steps after `step` to the `.rewound.jsonl`
        file beside this one; returns how many moved. Reads only the file's
        tail (its steps never go back), so a resume costs no memory in
        proportion to the run's length."""
        path = str(self._filename)
        if not os.path.exists(path):
            return 0
        with open(path, 'rb') as f:
            cut = _end_of_last_line_upto(f, step)
            f.seek(cut)
            lines = f.read().split(b'\n')
        kept, moved = [], []
        for line in lines:
            row = _parse(line)  # A line cut short by a crash stays.
            later = row is not None and row['step'] > step
            (moved if later else kept).append(line)
        if not moved:
            return 0
        side = path[:-len('.jsonl')] if path.endswith('.jsonl') else path
        with open(side + '.rewound.jsonl', 'ab') as f:
            f.write(b''.join(line + b'\n' for line in moved))
        with open(path, 'r+b') as f:
            f.truncate(cut)
            f.seek(cut)
            f.write(b'\n'.join(kept))
        last_step = _last_step_and_time(path)[0]
        self._anchor = (last_step, self._base)  # Time keeps going forward.
        self._newline = _ends_mid_line(path)
        return len(moved)

    def _write(self, summaries):
        now = self._base + time.monotonic() - self._start
        latest = max(step for step, _, _ in summaries)
        times = self._times(latest, now)
        # One line per step; a value logged again at the same step (several
        # envs ending an episode together) opens another line instead of
        # replacing the first, so every episode score is kept.
        rows, current = [], {}
        for step, name, value in summaries:
            if not self._pattern.search(name):
                continue
            if isinstance(value, str) or np.ndim(value) != 0:
                continue
            row = current.get(step)
            if row is None or name in row:
                row = current[step] = {}
                rows.append((step, row))
            row[name] = float(value)
        lines = ''.join(
            json.dumps({'step': step, 'time': round(times(step), 3), **row})
            + '\n' for step, row in rows)
        if lines:
            if self._newline:
                lines, self._newline = '\n' + lines, False
            with diskfull.writing(self._filename), self._filename.open(
                    'a') as f:
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


def _last_step_and_time(path, tail=1 << 16):
    """The `step` and `time` of the last complete line of a JSONL file that
    has both, or (0, 0.0)."""
    if not os.path.exists(path):
        return 0, 0.0
    with open(path, 'rb') as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - tail))
        lines = f.read().split(b'\n')[:-1]  # The last one may be partial.
    for line in reversed(lines):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and 'step' in row and 'time' in row:
            return row['step'], float(row['time'])
    return 0, 0.0


def _ends_mid_line(path):
    if not os.path.exists(path) or not os.path.getsize(path):
        return False
    with open(path, 'rb') as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) != b'\n'


def _parse(line):
    """The row of one line when it is a dict with a numeric `step`."""
    try:
        row = json.loads(line) if line.strip() else None
    except ValueError:
        return None
    if isinstance(row, dict) and isinstance(row.get('step'), (int, float)):
        return row
    return None


def _end_of_last_line_upto(f, step, block=1 << 16):
    """The offset just past the last line of `f` whose step is at most
    `step` (0 when there is none), read backwards a block at a time."""
    size = f.seek(0, os.SEEK_END)
    pos = stop = size  # `rest` holds the bytes from `pos` to `stop`.
    rest = b''
    while True:
        if pos > 0:
            pos -= min(block, pos)
            f.seek(pos)
            rest = f.read(stop - pos)
        first, *lines = rest.split(b'\n')
        # Every line after `first` is whole; `first` may go on before `pos`.
        if pos == 0:
            first, lines = b'', [first] + lines
        end = stop
        for line in reversed(lines):
            start = end - len(line)
            row = _parse(line)
            if row is not None and row['step'] <= step:
                return min(end + 1, size)
            end = start - 1  # Past the newline before this line.
        if pos == 0:
            return 0
        stop = pos + len(first)
        rest = first
