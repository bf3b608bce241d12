"""The safetensors file format, written and read with numpy alone.

A file is an 8-byte little-endian header length, a JSON header, then the
arrays' bytes back to back::

    {"enc/linear0/kernel": {"dtype": "F32", "shape": [64, 256],
                            "data_offsets": [0, 65536]},
     ...,
     "__metadata__": {"key": "a string", ...}}

(huggingface/safetensors' format: its libraries read these files, and this
module reads theirs.) Reading parses the JSON and views the bytes as arrays
of a fixed table of numeric dtypes: nothing in a file can run code, whoever
wrote it. Chosen over numpy's `.npz` (also safe with `allow_pickle=False`)
because it carries bfloat16, needs no zip archive (no CRC pass over the
bytes), and is the form model hubs share weights in.
"""

import json
import math
import mmap
import os

import numpy as np

# safetensors' dtype codes and numpy's names for them. The ml_dtypes ones
# (which JAX installs) are looked up when first met.
_CODES = {
    'F64': 'float64', 'F32': 'float32', 'F16': 'float16',
    'BF16': 'bfloat16', 'F8_E4M3': 'float8_e4m3fn', 'F8_E5M2': 'float8_e5m2',
    'I64': 'int64', 'I32': 'int32', 'I16': 'int16', 'I8': 'int8',
    'U64': 'uint64', 'U32': 'uint32', 'U16': 'uint16', 'U8': 'uint8',
    'BOOL': 'bool',
}
_NAMES = {name: code for code, name in _CODES.items()}
MAX_HEADER = 100 * 2**20  # As the safetensors library: 100 MB.
ALIGN = 8
# numpy asks the kernel for huge pages for arrays from 4 MiB on. Where the
# kernel compacts memory to find them on the first touch (THP defrag
# "madvise", a common default), reading into such arrays took 3-4 times
# as long as unpickling the same save; arrays from this size on are read
# into private anonymous memory (mmap) instead, with plain pages, as
# pickle's are (shared anonymous memory, mmap's default, faulted slower).
LARGE = 4 * 2**20


class FormatError(ValueError):
    """A file that is not a complete safetensors file; the message says
    what is wrong."""


def dtype_code(dtype):
    """The safetensors code of a numpy dtype, or None where the format has
    none (strings, objects, complex numbers, dates)."""
    return _NAMES.get(np.dtype(dtype).name)


def numpy_dtype(name):
    """The numpy dtype of a name of `_CODES`' values ('float32',
    'bfloat16'); raises ValueError for others."""
    if name not in _NAMES:
        raise ValueError(f'{name!r} is not a dtype of a safetensors file')
    if name.startswith(('bfloat', 'float8')):
        import ml_dtypes
        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


def write(file, arrays, metadata=None):
    """Writes `arrays` ({name: numpy array}) and `metadata` ({str: str})
    to the open binary `file`; returns the bytes written. The arrays are
    written from their own memory (no copy of the whole)."""
    ordered = []
    for name, array in arrays.items():
        array = np.asarray(array)
        if dtype_code(array.dtype) is None:
            raise TypeError(
                f"array '{name}' has dtype {array.dtype}, which a "
                f'safetensors file cannot hold')
        if array.dtype.byteorder == '>':
            array = array.astype(array.dtype.newbyteorder('<'))
        if not array.flags.c_contiguous:  # (ascontiguousarray makes 0-d 1-d)
            array = array.copy(order='C')
        ordered.append((name, array))
    # Larger items first, so that every array starts aligned to its item
    # size (the header is padded to 8 bytes), as safetensors orders them.
    ordered.sort(key=lambda x: (-x[1].dtype.itemsize, x[0]))
    header, offset = {}, 0
    for name, array in ordered:
        header[name] = {
            'dtype': dtype_code(array.dtype), 'shape': list(array.shape),
            'data_offsets': [offset, offset + array.nbytes]}
        offset += array.nbytes
    if metadata:
        header['__metadata__'] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(',', ':')).encode()
    text += b' ' * (-(8 + len(text)) % ALIGN)
    file.write(len(text).to_bytes(8, 'little'))
    file.write(text)
    for _, array in ordered:
        if array.nbytes:
            file.write(array.reshape(-1).view(np.uint8).data)
    return 8 + len(text) + offset


def save(filename, arrays, metadata=None):
    """`write` to a new file `filename` (not fsynced); returns its size."""
    with open(filename, 'wb') as f:
        return write(f, arrays, metadata)


def read(filename):
    """`(arrays, metadata)` of the safetensors file `filename`: {name:
    numpy array} (each in memory of its own) and {str: str}. Raises
    FormatError naming the file where it is not one, or is cut short."""
    with open(filename, 'rb') as f:
        size = os.fstat(f.fileno()).st_size
        header, start = _header(f, size, filename)
        metadata = header.pop('__metadata__', None) or {}
        if not isinstance(metadata, dict) or not all(
                isinstance(v, str) for v in metadata.values()):
            raise FormatError(f'{filename}: its __metadata__ is not strings')
        entries = _entries(header, size - start, filename)
        arrays = {}
        for name, dtype, shape, begin, end in entries:
            array = _empty(shape, dtype, end - begin)
            if end > begin and f.readinto(
                    memoryview(array.reshape(-1).view(np.uint8))) != (
                        end - begin):
                raise FormatError(f'{filename} changed while it was read')
            arrays[name] = array
    return arrays, metadata


def _empty(shape, dtype, nbytes):
    """A writable array of its own memory, uninitialised (see LARGE)."""
    if nbytes < LARGE:
        return np.empty(shape, dtype)
    memory = mmap.mmap(
        -1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return np.frombuffer(memory, dtype, math.prod(shape)).reshape(shape)


def _entries(header, length, filename):
    """[(name, dtype, shape, begin, end)] of the arrays of `header` in the
    order of their bytes, checked to cover the `length` bytes of data
    exactly, without gaps or overlaps."""
    entries = []
    for name, info in header.items():
        try:
            dtype = numpy_dtype(_CODES[info['dtype']])
            shape = tuple(int(x) for x in info['shape'])
            begin, end = (int(x) for x in info['data_offsets'])
        except (KeyError, TypeError, ValueError) as e:
            raise FormatError(
                f"{filename}: the entry of '{name}' is not an array's "
                f'({type(e).__name__}: {e})') from None
        if min(shape, default=0) < 0 or not 0 <= begin <= end <= length or (
                end - begin != math.prod(shape) * dtype.itemsize):
            raise FormatError(
                f"{filename}: the bytes of '{name}' ({begin}-{end}) do not "
                f'fit its shape {shape} and dtype {dtype.name} in '
                f'{length} bytes of data')
        entries.append((name, dtype, shape, begin, end))
    entries.sort(key=lambda e: (e[3], e[4]))
    covered = 0
    for _, _, _, begin, end in entries:
        if begin != covered:
            raise FormatError(f'{filename}: its arrays overlap or leave gaps')
        covered = end
    if covered != length:
        raise FormatError(
            f'{filename} holds {length - covered} bytes after its last array')
    return entries


def read_metadata(filename):
    """The `__metadata__` of `filename`, reading its header only."""
    with open(filename, 'rb') as f:
        header, _ = _header(f, os.fstat(f.fileno()).st_size, filename)
    return header.get('__metadata__') or {}


def problem(filename):
    """What makes `filename` other than a complete safetensors file (cut
    short, another kind of file), or None; reads its header only."""
    try:
        with open(filename, 'rb') as f:
            size = os.fstat(f.fileno()).st_size
            header, start = _header(f, size, filename)
        ends = [int(v['data_offsets'][1]) for k, v in header.items()
                if k != '__metadata__']
    except FormatError as e:
        return str(e)
    except (KeyError, TypeError, ValueError, IndexError):
        return f'{filename} has no valid safetensors header'
    if start + max(ends, default=0) != size:
        return (f'{filename} has {size} bytes, its header describes '
                f'{start + max(ends, default=0)}')
    return None


def _header(f, size, filename):
    head = f.read(8)
    if len(head) < 8:
        raise FormatError(f'{filename} is cut short (no safetensors header)')
    length = int.from_bytes(head, 'little')
    if length > min(size - 8, MAX_HEADER):
        raise FormatError(
            f'{filename} is not a safetensors file, or is cut short (its '
            f'first bytes announce a header of {length} bytes in a file of '
            f'{size})')
    try:
        header = json.loads(f.read(length))
    except (UnicodeDecodeError, ValueError) as e:
        raise FormatError(
            f'{filename} is not a safetensors file (its header is not '
            f'JSON: {e})') from None
    if not isinstance(header, dict):
        raise FormatError(f'{filename}: its header is not a JSON object')
    return header, 8 + length
