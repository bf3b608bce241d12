"""Flat, slash-separated names for the leaves of any pytree (parameters,
optimizer state), used by checkpoints and regex selection."""

import jax
import numpy as np


def path_str(path):
    parts = []
    for entry in path:
        if isinstance(entry, jax.tree_util.DictKey):
            parts.append(str(entry.key))
        elif isinstance(entry, jax.tree_util.SequenceKey):
            parts.append(str(entry.idx))
        elif isinstance(entry, jax.tree_util.GetAttrKey):
            parts.append(entry.name)
        elif isinstance(entry, jax.tree_util.FlattenedIndexKey):
            parts.append(str(entry.key))
        else:
            parts.append(str(entry))
    return '/'.join(parts)


def flatten(tree):
    """Returns {name: leaf} in a stable order."""
    pairs = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {path_str(path): leaf for path, leaf in pairs}


def replace(tree, values):
    """A copy of `tree` with the leaves named in `values` replaced."""
    pairs, treedef = jax.tree_util.tree_flatten_with_path(tree)
    leaves = [values.get(path_str(path), leaf) for path, leaf in pairs]
    return jax.tree_util.tree_unflatten(treedef, leaves)


def to_numpy(tree):
    return jax.tree.map(np.asarray, jax.device_get(tree))
