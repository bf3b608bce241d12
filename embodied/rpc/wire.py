"""portal's message encoding (`portal.pack` / `portal.unpack`), made faster.

Every request and reply of the parallel runner is encoded this way, a few
thousand times a second on a small machine, and portal's generic recursive
tree walk costs more there than the socket work. These functions produce and
read exactly the same bytes as portal's (tested against it), so our servers
and clients still talk to portal's, but walk the common structures (dicts,
lists, tuples, arrays, numbers, strings, bytes, None) directly. Anything else
goes through portal's own functions.
"""

import itertools
import struct

import msgpack
import numpy as np
from portal import packlib

_LEAF_TYPES = (
    type(None), str, bytes, bytearray, memoryview, np.ndarray, np.generic,
    int, float)


class _Unusual(Exception):
    """A structure portal handles that the fast path does not."""


def pack(data):
    """The buffers `portal.pack(data)` gives, with the same bytes."""
    leaves = []
    try:
        treedef = _flatten(data, leaves)
    except _Unusual:
        return packlib.pack(data)
    specs, buffers = [], []
    for value in leaves:
        if value is None:
            specs.append(['none'])
            buffers.append(b'\x00')
        elif isinstance(value, str):
            specs.append(['utf8'])
            buffers.append(_nonempty(value.encode('utf-8'), data))
        elif isinstance(value, (bytes, bytearray, memoryview)):
            if isinstance(value, memoryview):
                value = value.cast('c')
                assert value.c_contiguous
            specs.append(['bytes'])
            buffers.append(_nonempty(value, data))
        else:
            if not isinstance(value, np.ndarray):
                value = np.asarray(value)
            if value.dtype == object:
                raise TypeError(data)
            assert value.data.c_contiguous, (
                'Array is not contiguous in memory. Use '
                "np.asarray(arr, order='C') before passing the data into "
                'pack().')
            specs.append(['array', value.shape, value.dtype.str])
            buffers.append(value.data.cast('c') if value.size else b'\x00')
    buffers = [msgpack.packb(treedef), msgpack.packb(specs), *buffers]
    length = len(buffers).to_bytes(8, 'little', signed=False)
    sizes = struct.pack(f'<{len(buffers)}Q', *[len(x) for x in buffers])
    return [length, sizes, *buffers]


def _nonempty(buffer, data):
    # portal frames every leaf as one buffer and refuses empty ones (an
    # assertion deep in its socket code); say so where the data is made.
    if not len(buffer):
        raise ValueError(
            f"portal's wire format cannot carry an empty string or bytes "
            f"(in {_describe(data)}).")
    return buffer


def _describe(data):
    text = repr(data)
    return text if len(text) <= 200 else text[:200] + '...'


def _flatten(tree, leaves):
    """Appends the leaves in portal's order; returns the tree with None in
    place of each leaf (portal's treedef)."""
    kind = type(tree)
    if kind is dict:
        return {k: _flatten(v, leaves) for k, v in tree.items()}
    if kind is list or kind is tuple:
        return [_flatten(v, leaves) for v in tree]
    if isinstance(tree, _LEAF_TYPES):
        leaves.append(tree)
        return None
    raise _Unusual(kind)


def unpack(buffer):
    """What `portal.unpack(buffer)` returns."""
    whole = buffer
    count = int.from_bytes(buffer[:8], 'little', signed=False)
    sizes = struct.unpack(f'<{count}Q', buffer[8:8 + 8 * count])
    buffer = buffer[8 + 8 * count:]
    ends = list(itertools.accumulate(sizes))
    parts = [buffer[i:j] for i, j in zip([0, *ends[:-1]], ends)]
    treedef, specs, *parts = parts
    treedef = msgpack.unpackb(treedef)
    specs = msgpack.unpackb(specs)
    leaves = []
    for spec, part in zip(specs, parts):
        kind = spec[0]
        if kind == 'array':
            shape, dtype = spec[1:]
            if 0 in shape:
                assert part == b'\x00'
                part = b''
            leaves.append(np.frombuffer(part, dtype).reshape(shape))
        elif kind == 'none':
            assert part == b'\x00'
            leaves.append(None)
        elif kind == 'utf8':
            leaves.append(bytes(part).decode('utf-8'))
        elif kind == 'bytes':
            leaves.append(part)
        else:
            return packlib.unpack(whole)  # E.g. portal's shared arrays.
    return _unflatten(treedef, iter(leaves))


def _unflatten(treedef, leaves):
    kind = type(treedef)
    if kind is dict:
        return {k: _unflatten(v, leaves) for k, v in treedef.items()}
    if kind is list:
        return [_unflatten(v, leaves) for v in treedef]
    return next(leaves)
