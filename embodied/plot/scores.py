"""The original's scores format: a gzipped JSON list of runs, each
`{"task", "method", "seed", "xs", "ys"}` (env steps and episode scores,
`null` where a binned run has no episode)."""

import dataclasses
import gzip
import json
import math
import pathlib

import numpy as np

SUFFIX = '.json.gz'
KEYS = ('task', 'method', 'seed', 'xs', 'ys')


@dataclasses.dataclass
class Record:
    """One run: its task, method and seed, and its scores `ys` at env steps
    `xs` (NaN for a published `null`)."""

    task: str
    method: str
    seed: object
    xs: np.ndarray
    ys: np.ndarray

    def __post_init__(self):
        self.xs = np.asarray(self.xs, float)
        self.ys = np.array(
            [np.nan if y is None else y for y in self.ys], float)
        if self.xs.shape != self.ys.shape or self.xs.ndim != 1:
            raise ValueError(
                f'run {self.task}/{self.method}/{self.seed}: xs and ys '
                f'differ in length ({self.xs.shape} and {self.ys.shape})')


def read(path):
    """The runs of one scores file, as Records. A file that is not one is a
    ValueError naming the file and what is wrong with it."""
    path = pathlib.Path(path)
    try:
        with gzip.open(path, 'rt') as f:
            entries = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f'{path}: no such scores file.') from None
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(
            f'{path}: not a scores file (gzipped JSON list of runs): '
            f'{e}') from None
    if not isinstance(entries, list):
        raise ValueError(f'{path}: not a scores file: expected a list of '
                         f'runs, found {type(entries).__name__}.')
    records = []
    for index, entry in enumerate(entries):
        missing = [k for k in KEYS if not isinstance(entry, dict) or k not in entry]
        if missing:
            raise ValueError(f'{path}: run {index} has no {", ".join(missing)} '
                             f'(each run needs {", ".join(KEYS)}).')
        try:
            records.append(Record(**{k: entry[k] for k in KEYS}))
        except (TypeError, ValueError) as e:
            raise ValueError(f'{path}: run {index}: {e}') from None
    return records


def write(path, records):
    """Writes Records as a scores file (`null` for NaN, whole numbers as
    integers). Returns the path."""
    path = pathlib.Path(path)
    if not path.name.endswith(SUFFIX):
        raise ValueError(f'{path}: a scores file is named *{SUFFIX}.')
    entries = [{
        'task': r.task, 'method': r.method, 'seed': _plain(r.seed),
        'xs': [_number(x) for x in r.xs], 'ys': [_number(y) for y in r.ys],
    } for r in records]
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, 'wt') as f:
        json.dump(entries, f)
    return path


def _number(value):
    value = float(value)
    if math.isnan(value):
        return None
    return int(value) if value.is_integer() and abs(value) < 2 ** 53 else value


def _plain(seed):
    return seed.item() if isinstance(seed, np.generic) else seed
