"""What a `save()` returns, as a JSON structure plus named arrays.

    tree, arrays = savetree.split(agent.save(), 'agent')
    data = savetree.join(tree, arrays)  # equal to what save() returned

The structure is plain JSON where it can be: dicts with string keys,
lists, strings, numbers, booleans and None stand for themselves. Each
numpy array (or numpy scalar, or JAX array) is taken out and replaced by
`{"__embodied__": "array", "name": ..., "dtype": ..., "shape": [...]}`,
named by its tree path ('enc/linear0/kernel', 'counters/updates'); the
arrays go to a safetensors file (`tensorfile`). Tuples, bytes and dicts
with other keys are tagged the same way. Anything else (an object of a
class, a set, a function, an array of strings or objects) cannot be held
without a pickle: `split` refuses it with `Unsavable`, naming its path.
"""

import numbers
import re

import numpy as np

from . import tensorfile

TAG = '__embodied__'


class Unsavable(TypeError):
    """A value of a save that neither JSON nor an array file holds; the
    message names the entry and its path."""


EXIT_CODE = 2  # A run whose save was refused ends with it.
_TEXT = re.compile(r'Unsavable: (Cannot save [^\n]*)')


def find(error):
    """The Unsavable behind `error`: itself, its cause or context, or one
    that an RPC error or a worker's exit summary quotes; else None."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, Unsavable):
            return error
        match = _TEXT.search(str(error))
        if match:
            return Unsavable(match.group(1).removesuffix(' [...]'))
        error = error.__cause__ or error.__context__
    return None


def split(data, entry):
    """`(tree, arrays)` of `data`, the value `entry`'s `save()` returned."""
    arrays = {}
    tree = _split(data, [], arrays, entry)
    return tree, arrays


def join(tree, arrays):
    """The value that `split` took apart; raises ValueError on a structure
    that `split` cannot have written."""
    return _join(tree, arrays)


def _split(value, path, arrays, entry):
    if isinstance(value, np.generic) or _is_array(value):
        return _array(value, path, arrays, entry)
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, (bytes, bytearray)):
        name = _name(path, arrays)
        arrays[name] = np.frombuffer(bytes(value), np.uint8)
        return {TAG: 'bytes', 'name': name}
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and TAG not in value:
            return {k: _split(v, [*path, k], arrays, entry)
                    for k, v in value.items()}
        return {TAG: 'dict', 'items': [
            [_key(k, path, entry), _split(v, [*path, str(k)], arrays, entry)]
            for k, v in value.items()]}
    if isinstance(value, list):
        return [_split(v, [*path, str(i)], arrays, entry)
                for i, v in enumerate(value)]
    if isinstance(value, tuple):
        return {TAG: 'tuple', 'items': [
            _split(v, [*path, str(i)], arrays, entry)
            for i, v in enumerate(value)]}
    kind = type(value)
    raise Unsavable(
        f"Cannot save {_where(entry, path)}: it is a "
        f"{kind.__module__}.{kind.__qualname__}, which a save holds only "
        f"as a pickle. save() may return numpy arrays, numbers, strings, "
        f"bytes, None, and lists, tuples and dicts of them.")


def _is_array(value):
    # numpy arrays, and JAX's (or another library's) without importing it.
    return isinstance(value, np.ndarray) or (
        hasattr(value, '__array__') and hasattr(value, 'dtype')
        and hasattr(value, 'shape') and not isinstance(value, type))


def _array(value, path, arrays, entry):
    scalar = isinstance(value, np.generic)
    array = np.asarray(value)
    if tensorfile.dtype_code(array.dtype) is None:
        raise Unsavable(
            f'Cannot save {_where(entry, path)}: it is an array of dtype '
            f'{array.dtype}, and a save holds arrays of numbers and bools '
            f'only (strings go in lists).')
    name = _name(path, arrays)
    arrays[name] = array
    node = {TAG: 'array', 'name': name, 'dtype': array.dtype.name,
            'shape': list(array.shape)}
    if scalar:
        node['scalar'] = True
    return node


def _key(key, path, entry):
    """A dict key that is not a string, as a JSON value."""
    if isinstance(key, np.generic):
        key = key.item()
    if key is None or isinstance(key, bool):
        return key
    if isinstance(key, str):
        return str(key)
    if isinstance(key, numbers.Integral):
        return int(key)
    if isinstance(key, float):
        return float(key)
    if isinstance(key, tuple):
        return {TAG: 'tuple', 'items': [_key(k, path, entry) for k in key]}
    raise Unsavable(
        f'Cannot save {_where(entry, path)}: it has a dict key of type '
        f'{type(key).__name__} ({key!r}); keys may be strings, numbers, '
        f'None and tuples of them.')


def _name(path, arrays):
    """The array's name: its tree path, made unique."""
    base = '/'.join(path) or '.'
    name, count = base, 1
    while name in arrays:
        count += 1
        name = f'{base}#{count}'
    return name


def _where(entry, path):
    return f"'{entry}'" + (f" entry '{'/'.join(path)}'" if path else '')


def _join(node, arrays):
    if isinstance(node, list):
        return [_join(v, arrays) for v in node]
    if not isinstance(node, dict):
        return node
    kind = node.get(TAG)
    if kind is None:
        return {k: _join(v, arrays) for k, v in node.items()}
    if kind == 'array':
        array = arrays.get(node.get('name'))
        if array is None:
            raise ValueError(f"no array '{node.get('name')}' in the file")
        if array.dtype.name != node.get('dtype') or list(
                array.shape) != node.get('shape'):
            raise ValueError(
                f"array '{node['name']}' is {array.dtype.name}"
                f"{list(array.shape)} in the file, "
                f"{node.get('dtype')}{node.get('shape')} in the structure")
        return array[()] if node.get('scalar') else array
    if kind == 'bytes':
        array = arrays.get(node.get('name'))
        if array is None or array.dtype != np.uint8:
            raise ValueError(f"no bytes '{node.get('name')}' in the file")
        return array.tobytes()
    if kind == 'tuple':
        return tuple(_join(v, arrays) for v in node['items'])
    if kind == 'dict':
        return {_hashable(_join(k, arrays)): _join(v, arrays)
                for k, v in node['items']}
    raise ValueError(f'unknown node {TAG}={kind!r}')


def _hashable(key):
    if isinstance(key, (dict, list)):
        raise ValueError(f'a dict key {key!r} is not hashable')
    return key
