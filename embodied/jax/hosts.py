"""The agent base across the hosts of a run of several replicas.

`distributed.py` joins the replicas; these helpers are what the agent does
differently once they have joined: the learner's batch holds every host's
rows, the policy acts on a host-local copy of the (replicated) parameters,
and the collectives' first runs start together. With one process each
helper is the identity (or does nothing).
"""

import jax

from . import distributed
from . import fetch
from . import mesh as meshlib


def global_rows(batch_size):
    """The rows of a learner batch over all replicas: each host feeds
    `batch_size` rows of its own replay."""
    return batch_size * jax.process_count()


def local_rows(batch_size):
    """This host's rows of a global batch of `batch_size` rows."""
    return batch_size // jax.process_count()


def policy_init_stream():
    """The seed stream of policy carries: 'init' as in the original with
    one replica; with several 'policy', so that the 'init' stream, which
    the learner's collective calls read, advances alike on every replica
    however often each one's actor starts carries."""
    return 'init' if distributed.acting_replica() is None else 'policy'


def seed_entropy(name, entropy):
    """The entropy of a call's seed of stream `name`: with replicas, each
    one acts in its own envs with its own randomness ('policy' adds the
    replica's index, in its agent's process or its policy process); the
    learner's streams stay the same on every replica."""
    replica = distributed.acting_replica()
    if name == 'policy' and replica is not None:
        return [*entropy, replica]
    return entropy


def check_replicated_params(layout, param_rules):
    """With several replicas, refuses a train mesh (`layout`) on which the
    model's partition rules would split the parameters (f or t above 1):
    each replica's policy copies them to its own devices, and replica 0
    alone saves them, so every host must hold all of them."""
    if jax.process_count() == 1 or not param_rules:
        return
    if layout.shape['f'] == 1 and layout.shape['t'] == 1:
        return
    raise meshlib.LayoutError(
        f"{layout.key} is '{layout.text}' (f={layout.shape['f']}, "
        f"t={layout.shape['t']}), on which the model's partition rules "
        f"split the parameters; with {jax.process_count()} replicas "
        f"every host must hold all parameters (its policy acts on its "
        f"own copy and replica 0 alone saves them). Split the batch "
        f"only: f and t of 1, e.g. {layout.key} '{meshlib.DEFAULT}'.")


def host_params(params, layout):
    """With several replicas, the parameters as arrays on this host's
    devices (the policy mesh is local): the value of each replicated
    global array. One process: as given. `layout` is the train mesh's,
    named when a parameter is split."""
    if jax.process_count() == 1:
        return params
    split = [k for k, v in params.items() if not v.is_fully_replicated]
    if split:  # Refused when the agent is built (check_replicated_params).
        raise meshlib.LayoutError(
            f"With several replicas the policy parameters must be "
            f"replicated on the train mesh ({layout.key} "
            f"'{layout.text}'), but {', '.join(split[:3])} "
            f"are split by the partition rules.")
    return {k: fetch.host_local(v) for k, v in params.items()}


class FirstRuns:
    """Meets the other replicas before a collective first runs at new
    shapes. Gloo builds a program's connections on its first run and gives
    up on a peer that arrives more than 30 s later (still compiling, or
    still waiting for its first batch). Replicas call the collectives in
    the same order, so they meet at these barriers in the same order."""

    def __init__(self, state, state_lock):
        self._state = state  # Returns the agent's state; read under the lock.
        self._state_lock = state_lock
        self._shapes = set()

    def meet(self, jitted, *args):
        """With several replicas, compiles the collective `jitted` for the
        agent's state and `args` (if not yet) and, the first time it runs
        at these shapes, waits until every replica is about to run it
        too."""
        if not distributed.started():
            return
        # The state's shapes never change; the carry's and data's can.
        key = (jitted, signature(args))
        if key in self._shapes:
            return
        with self._state_lock:
            jitted.lower(self._state(), *args).compile()
        self._shapes.add(key)
        distributed.barrier(f'first-run-{len(self._shapes)}')


def signature(tree):
    """The structure of `tree`, the shapes and dtypes of its arrays and the
    values of its other leaves (static arguments): what decides whether jit
    compiles anew."""
    leaves, structure = jax.tree.flatten(tree)
    return structure, tuple(
        (x.shape, str(x.dtype)) if hasattr(x, 'shape') else repr(x)
        for x in leaves)
