"""Argument checks shared by constructors, with errors that name the owner
and the argument, and the checks of values that cross a boundary."""

import numpy as np


def integers(owner, least, **values):
    """Raises a ValueError unless every value is a whole number >= `least`;
    `owner` and the keyword name the argument in the message."""
    for name, value in values.items():
        if int(value) != value or value < least:
            raise ValueError(
                f'{owner}: {name} must be an integer >= {least}, '
                f'got {value!r}.')


def choice(owner, name, value, options):
    """Raises a ValueError naming `owner` unless `value` is in `options`."""
    if value not in options:
        raise ValueError(
            f"Unknown {owner} {name} '{value}': choose one of "
            f"{', '.join(options)}.")


def nonfinite(batch, envids, skip_prefix='log/'):
    """Where a batch of observations (a dict of arrays, one row per env)
    holds NaN or infinity, as 'Env 3: obs 'vector' is not finite (nan at
    index (0,))', or None. Keys starting with `skip_prefix` (the envs' own
    metrics, where NaN may mean 'no value') are not checked. For envs whose
    steps did not pass `wrappers.CheckSpaces`, e.g. the original's env
    processes or an unwrapped env of a user's script."""
    for key, value in batch.items():
        if key.startswith(skip_prefix):
            continue
        value = np.asarray(value)
        if value.dtype.kind not in 'fc' or not value.size:
            continue
        if np.isfinite(np.add.reduce(value, axis=None)):
            continue  # One reduction, no mask; an overflow is looked at.
        finite = np.isfinite(value)
        if finite.all():
            continue
        where = np.argwhere(~finite)[0]
        row, index = int(where[0]), tuple(int(i) for i in where[1:])
        envid = envids[row] if envids is not None else row
        return (f"Env {envid}: obs '{key}' is not finite ("
                f"{value[tuple(where)]} at index {index}).")
    return None
