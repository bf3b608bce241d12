"""Helpers the modules share with the agent base."""

import jax


def get_data_axes():
    """The named data-parallel mesh axes ('d', 'f') when called inside a
    mapped computation that defines them, else (): modules average their
    statistics over these axes."""
    axes = ('d', 'f')
    for axis in axes:
        try:
            jax.lax.axis_index(axis)
        except NameError:
            return ()
    return axes
