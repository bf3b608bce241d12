"""Argument checks of the in-package envs, with errors that name the env."""

import numpy as np


def choice(env, what, value, options):
    """Raises a ValueError naming `env` unless `value` is in `options`."""
    if value not in options:
        raise ValueError(
            f"Unknown {env} {what} '{value}': choose one of "
            f"{', '.join(options)}.")


def positive_int(env, what, value):
    """Raises a ValueError naming `env` unless `value` is an int >= 1."""
    if not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(
            f'{env} {what} must be a positive int, got {value!r}.')
