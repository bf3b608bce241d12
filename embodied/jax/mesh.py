"""Device meshes: the original's `jax.policy_mesh` and `jax.train_mesh`.

A mesh string 'd,f,t' lays devices out on three named axes:

    d   data parallel: each group of devices along d takes its own slice of
        the batch and holds whole parameters (unless f or t split them)
    f   fully sharded data parallel (FSDP): also takes its own slice of the
        batch, and the partition rules may split parameters and optimizer
        state over it, so each device holds 1/f of them
    t   tensor parallel: the batch is not split over t; the partition rules
        may split the large matrix multiplies over it

At most one size may be -1: it takes the devices the others leave. The
default '-1,1,1' is plain data parallelism over every chosen device.
Batches are split over the data axes `DATA_AXES` = ('d', 'f'), so a batch
size must divide by d * f.

Which devices. `jax.train_devices` (and `jax.policy_devices`) name device
indices, as in the original. A mesh with a -1 spans exactly the named
devices. A mesh of fixed sizes that needs more devices than are named takes
the named ones first, then the lowest-numbered others: `--jax.mock_devices 8
--jax.train_mesh 2,2,2` trains on devices 0-7 with the default
`train_devices` [0]. A fixed mesh that needs fewer devices than are named is
an error, as is one that needs more devices than exist.

API (used by `agent.py`; multi-host code extends `global_batch`):

    parse(text, key)                  the sizes, -1 kept; LayoutError if bad
    fit(text, count, key)             the sizes for `count` devices
    choose_devices(devices, indices, text, key)
                                      the devices a mesh spans (see above)
    check_config(jaxcfg, batch_size)  the checks that need no JAX (main
                                      runs them before any worker starts)
    Layout(devices, text, key)        .mesh, .replicated, .batch (sharding
                                      of batches), .data_size (d * f),
                                      .shape ({'d','f','t': size})
    global_batch(tree, sharding)      host arrays -> arrays on the mesh

`LayoutError` is a `core.errors.BadValue`, so `embodied.main` reports it as a
usage error (exit status 2).
"""

import math

import numpy as np

from embodied.core.errors import BadValue

AXES = ('d', 'f', 't')
DATA_AXES = ('d', 'f')
DEFAULT = '-1,1,1'


class LayoutError(BadValue):
    """A mesh or batch size that does not fit the devices; names the key."""

    def __init__(self, problem):
        super().__init__([problem])


def parse(text, key):
    """The sizes of a 'd,f,t' mesh string (a -1 kept as -1)."""
    text = str(text).strip()
    parts = [p.strip() for p in text.split(',')]
    try:
        sizes = tuple(int(p) for p in parts)
    except ValueError:
        sizes = ()
    if (len(sizes) != len(AXES) or any(s == 0 or s < -1 for s in sizes) or
            sum(s == -1 for s in sizes) > 1):
        raise LayoutError(
            f"{key} is '{text}'; expected three sizes 'd,f,t' (data, FSDP, "
            f"tensor parallel), each >= 1, at most one -1, e.g. '-1,1,1' or "
            f"'2,2,2'.")
    return sizes


def fit(text, count, key):
    """The mesh sizes for `count` devices; the -1 takes what is left."""
    sizes = parse(text, key)
    fixed = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if count % fixed:
            devices = key.replace('_mesh', '_devices')
            raise LayoutError(
                f"{key} '{text}' needs a multiple of {fixed} devices, but "
                f"{count} are chosen (a mesh with -1 spans the devices "
                f"{devices} names); {_fitting(count)}, or fixed sizes such "
                f"as '{_example(sizes)}' that take more devices.")
        sizes = tuple(count // fixed if s == -1 else s for s in sizes)
    elif fixed != count:
        raise LayoutError(
            f"{key} '{text}' needs {fixed} devices, but {count} are "
            f"chosen; {_fitting(count)}, or one size -1.")
    return sizes


def choose_devices(devices, indices, text, key):
    """The devices a mesh spans: those `indices` names, extended by the
    lowest-numbered others when a fixed-size mesh needs more (see the module
    docstring). `devices` are all devices, in index order."""
    sizes = parse(text, key)
    chosen = [devices[i] for i in indices]
    if -1 in sizes:
        return chosen
    need = math.prod(sizes)
    if need > len(devices):
        raise LayoutError(
            f"{key} '{text}' needs {need} devices, but only {len(devices)} "
            f"exist; {_fitting(len(devices))}, or one size -1 "
            f"(jax.mock_devices fakes more devices on CPU).")
    if need > len(chosen):
        others = [d for d in devices if d not in chosen]
        chosen += others[:need - len(chosen)]
    return chosen


def check_batch(batch_size, data_size, key, text, what):
    """Raises LayoutError unless `batch_size` divides over the `data_size`
    (d * f) devices of the mesh `text` given as `key`."""
    if batch_size % data_size:
        lower = batch_size - batch_size % data_size
        near = sorted({lower or data_size, lower + data_size})
        raise LayoutError(
            f"{what} {batch_size} does not divide over the {data_size} "
            f"data-parallel devices of {key} '{text}' (d * f); use a "
            f"multiple of {data_size} (e.g. {' or '.join(map(str, near))}), "
            f"or a mesh whose d * f divides {batch_size}.")


def check_config(jaxcfg, batch_size, replicas=1):
    """Raises LayoutError for mesh strings that cannot parse and, where the
    device count is known before JAX starts (`jax.mock_devices`), for meshes
    that do not fit it and a `batch_size` that does not divide over the
    train mesh's data axes. With several `replicas` the train mesh spans
    every host's devices and batch (a fixed-size mesh takes an equal share
    of each host's). The agent checks the rest when it is built."""
    texts = {
        key: str(jaxcfg.get(key.split('.')[1], DEFAULT))
        for key in ('jax.train_mesh', 'jax.policy_mesh')}
    for key, text in texts.items():
        parse(text, key)
    count = int(jaxcfg.get('mock_devices', 0) or 0)
    if not count:
        return
    devices = list(range(count))
    for key, indices in (
            ('jax.train_mesh', jaxcfg.get('train_devices', [0])),
            ('jax.policy_mesh', jaxcfg.get('policy_devices', [0]))):
        indices = [i for i in indices if 0 <= int(i) < count]
        if key == 'jax.train_mesh' and replicas > 1:
            sizes = _fit_over_hosts(
                texts[key], len(set(indices)) or 1, count, replicas, key)
        else:
            chosen = choose_devices(devices, indices, texts[key], key)
            sizes = fit(texts[key], len(chosen), key)
        if key == 'jax.train_mesh':
            check_batch(
                int(batch_size) * replicas, sizes[0] * sizes[1], key,
                texts[key], 'batch_size x replicas' if replicas > 1 else
                'batch_size')


def _fit_over_hosts(text, chosen, count, replicas, key):
    """The sizes of a train mesh over `replicas` hosts of `count` devices
    each, `chosen` of them named: a mesh with -1 spans the named devices of
    every host; a fixed one needs an equal share of every host's."""
    sizes = parse(text, key)
    if -1 in sizes:
        return fit(text, chosen * replicas, key)
    need = math.prod(sizes)
    if need % replicas or need // replicas > count:
        raise LayoutError(
            f"{key} '{text}' spans {need} devices, which do not split "
            f"evenly over the {replicas} replicas' hosts of {count} "
            f"devices each (jax.mock_devices).")
    return sizes


def _fitting(count):
    divisors = [n for n in range(1, count + 1) if count % n == 0]
    examples = dict.fromkeys([f"'{count},1,1'", f"'1,{count},1'"])
    return (
        f"sizes whose product is {count} would fit ({', '.join(examples)}; "
        f"divisors of {count}: {', '.join(map(str, divisors))})")


def _example(sizes):
    return ','.join('1' if s == -1 else str(s) for s in sizes)


class Layout:
    """A mesh over `devices` from a mesh string, with the shardings the agent
    uses: `replicated` (every device holds all of it) and `batch` (the
    leading axis split over the data axes)."""

    def __init__(self, devices, text, key):
        from jax.sharding import Mesh, NamedSharding, PartitionSpec
        sizes = fit(text, len(devices), key)
        self.key = key
        self.text = str(text)
        self.devices = tuple(devices)
        self.mesh = Mesh(np.array(devices, object).reshape(sizes), AXES)
        self.shape = dict(zip(AXES, sizes))
        self.data_size = sizes[0] * sizes[1]
        self.replicated = NamedSharding(self.mesh, PartitionSpec())
        self.batch = NamedSharding(self.mesh, PartitionSpec(DATA_AXES))

    def check_batch(self, batch_size, what):
        """Raises LayoutError unless `batch_size` divides over d * f."""
        check_batch(batch_size, self.data_size, self.key, self.text, what)

    def __repr__(self):
        sizes = ','.join(str(self.shape[a]) for a in AXES)
        return f'Layout({self.key}={sizes} over {len(self.devices)} devices)'


def global_batch(tree, sharding):
    """Host arrays (this process's whole batch) as arrays laid out by
    `sharding`. One process: a plain transfer. The single place where a
    batch enters the mesh, so that several processes can later build global
    arrays from their local parts here: with several processes (replicas),
    `tree` is this process's rows of the global batch, which is the
    processes' rows joined in process order."""
    import jax
    if jax.process_count() == 1:
        return jax.device_put(tree, sharding)
    return jax.tree.map(
        lambda x: jax.make_array_from_process_local_data(sharding, x), tree)
