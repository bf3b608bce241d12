"""Results of a device computation, copied to the host in the background."""

import collections.abc
import threading

import jax
import jax.numpy as jnp
import numpy as np


class Fetched(collections.abc.Mapping):
    """A dict of device arrays whose copy to the host starts at once and is
    waited for only when a value is first read.

    `agent.train()` returns its outputs and metrics as `Fetched` mappings, so
    the learner can dispatch the next update before it reads this one's:

        carry, outs, mets = agent.train(carry, batch)     # no wait here
        carry, outs2, mets2 = agent.train(carry, batch2)  # queued behind it
        agg.add(mets)                                     # waits for update 1

    Reading gives numpy arrays (nested dicts stay dicts), bfloat16 as
    float32. Keys, `len()` and `in` never wait.
    """

    def __init__(self, tree):
        if not isinstance(tree, dict):
            raise TypeError(f'Fetched needs a dict, got {type(tree).__name__}.')
        for leaf in jax.tree.leaves(tree):
            if isinstance(leaf, jax.Array) and leaf.is_fully_addressable:
                leaf.copy_to_host_async()
        self._tree = tree
        self._keys = tuple(tree)
        self._host = None
        self._lock = threading.Lock()

    def ready(self):
        """Whether reading would not wait for the device."""
        if self._host is not None:
            return True
        return all(
            leaf.is_ready() for leaf in jax.tree.leaves(self._tree)
            if isinstance(leaf, jax.Array))

    def result(self):
        """The values as a plain dict of numpy arrays (waits if needed)."""
        with self._lock:
            if self._host is None:
                self._host = to_numpy(self._tree)
                self._tree = None
        return self._host

    def __getitem__(self, key):
        return self.result()[key]

    def __contains__(self, key):
        return key in self._keys

    def __iter__(self):
        return iter(self._keys)

    def __len__(self):
        return len(self._keys)

    def __repr__(self):
        state = 'fetched' if self._host is not None else 'pending'
        return f'Fetched({state}, keys={list(self._keys)})'


def to_numpy(tree):
    """Device arrays to numpy; bfloat16 becomes float32 (loggers and the
    replay cannot take bfloat16). Of an array that spans several hosts
    (replicas), this host's part: the whole value when it is replicated,
    else this host's rows (see `host_local`)."""
    def convert(x):
        x = np.asarray(host_local(x))
        return x.astype(np.float32) if x.dtype == jnp.bfloat16 else x
    return jax.tree.map(convert, jax.device_get(jax.tree.map(host_local, tree)))


def host_local(x):
    """`x` if this process can read all of it; of a global array over
    several processes, the value when replicated, else this process's
    rows (its shards along the first axis, in order): what it fed in with
    `jax.make_array_from_process_local_data`."""
    if not isinstance(x, jax.Array) or x.is_fully_addressable:
        return x
    if x.is_fully_replicated:
        return x.addressable_shards[0].data
    parts = {}
    for shard in x.addressable_shards:
        start = shard.index[0].start or 0 if shard.index else 0
        parts.setdefault(start, shard.data)
    return np.concatenate([np.asarray(parts[k]) for k in sorted(parts)], 0)
