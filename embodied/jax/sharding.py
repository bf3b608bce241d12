"""Partition rules: how parameters and activations are laid out on a mesh.

A model may set `partition_rules = (param_rules, activation_rules)`, as in
the original. Each is a list of `(regex, PartitionSpec)`; the first regex
that `re.search`es a name decides its spec, over the mesh axes 'd', 'f', 't'
(see `mesh.py`).

    param_rules        over the names of the agent's state ('enc/linear0/
                       kernel', and the optimizer's moments, whose names
                       end in the parameter's name): how each is stored.
                       A name no rule matches is an error. Without rules
                       (or with an empty list) everything is replicated.
    activation_rules   over '<module path>/<output>' names of the layers in
                       `embodied.jax.nets` (e.g. 'dyn/core/linear0/out'):
                       the layout of their outputs while the model runs, a
                       `with_sharding_constraint`. A name no rule matches
                       is left to the compiler.

A spec names axes per dimension from the left; missing trailing dimensions
are not split. A spec axis that does not divide its dimension is dropped for
that array (the dimension stays whole), so one rule such as
`('kernel$', P('f', 't'))` can cover kernels of every size; a spec longer
than the array's rank is an error.

API (used by `agent.py`):

    param_shardings(shapes, rules, mesh)   {name: NamedSharding}
    activations(mesh, rules)               context: the nets layers apply
                                           the rules while tracing in it
    constrain(tree, shardings)             `with_sharding_constraint`
    summary(shardings)                     one line per rule's layout
"""

import contextlib
import re
import threading

import jax
from jax.sharding import NamedSharding, PartitionSpec

from . import nets

_lock = threading.RLock()


def param_shardings(shapes, rules, mesh):
    """The sharding of each entry of `shapes` ({name: array or shape
    struct}) by the first matching rule; replicated without rules."""
    rules = list(rules) or [('.*', PartitionSpec())]
    compiled = [(re.compile(regex), spec) for regex, spec in rules]
    result = {}
    for name, value in shapes.items():
        for pattern, spec in compiled:
            if pattern.search(name):
                break
        else:
            raise ValueError(
                f"No partition rule matches the parameter '{name}'; add a "
                f"rule for it, or a last rule ('.*', P()) to replicate the "
                f"rest.")
        result[name] = NamedSharding(
            mesh, fit_spec(spec, value.shape, mesh, name))
    return result


def fit_spec(spec, shape, mesh, name='array'):
    """`spec` for an array of `shape`: axes that do not divide their
    dimension are dropped."""
    spec = tuple(spec)
    if len(spec) > len(shape):
        raise ValueError(
            f"Partition spec {PartitionSpec(*spec)} for '{name}' has "
            f"{len(spec)} entries, but the array has rank {len(shape)} "
            f"(shape {tuple(shape)}).")
    fitted = []
    for entry, size in zip(spec, shape):
        names = () if entry is None else (
            (entry,) if isinstance(entry, str) else tuple(entry))
        kept, parts = [], 1
        for axis in names:
            if size % (parts * mesh.shape[axis]) == 0:
                kept.append(axis)
                parts *= mesh.shape[axis]
        fitted.append(
            None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
    while fitted and fitted[-1] is None:
        fitted.pop()
    return PartitionSpec(*fitted)


@contextlib.contextmanager
def activations(mesh, rules):
    """While tracing inside, the layers of `embodied.jax.nets` constrain
    their outputs by `rules` (see the module docstring); on a one-device
    mesh they add nothing. Traces run under
    the agent's trace lock; this lock also guards against other callers."""
    rules = [(re.compile(regex), spec) for regex, spec in rules]
    with _lock:
        previous = nets.LAYER_CALLBACK
        # On one device there is nothing to lay out; no constraint keeps
        # the program as it is without a mesh.
        if rules and mesh.size > 1:
            nets.LAYER_CALLBACK = _constrainer(mesh, rules)
        try:
            yield
        finally:
            nets.LAYER_CALLBACK = previous


def constrain(tree, shardings):
    """`tree` laid out by `shardings` inside a traced function. Also on one
    device: the outputs then carry the same sharding as the inputs of the
    next call, which therefore reuses its compiled program."""
    return jax.lax.with_sharding_constraint(tree, shardings)


def _constrainer(mesh, rules):
    def constrain(tensor, name):
        for pattern, spec in rules:
            if pattern.search(name):
                return jax.tree.map(
                    lambda x: jax.lax.with_sharding_constraint(x, NamedSharding(
                        mesh, fit_spec(spec, x.shape, mesh, name))), tensor)
        return tensor
    return constrain


def summary(shardings):
    """Lines that count the arrays per layout, e.g. "12 arrays P('f', 't')"."""
    counts = {}
    for sharding in shardings.values():
        key = str(sharding.spec)
        counts[key] = counts.get(key, 0) + 1
    return [f'{n:>5} arrays {spec}' for spec, n in sorted(
        counts.items(), key=lambda x: -x[1])]
