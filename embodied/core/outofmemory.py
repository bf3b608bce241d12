"""A program that asked a device for more memory than it has: XLA's
RESOURCE_EXHAUSTED status, raised by JAX as a runtime error.

    @outofmemory.program('train')     # names the program on such an error
    def train(self, ...): ...
    error = outofmemory.find(exception)  # also inside an RPC error's text
    error.program, error.requested       # 'train', bytes or None

The agent names the program it ran (`PROGRAMS`); a run that meets one ends
with `EXIT_CODE` and one line (`embodied.run.ending.out_of_memory_line`):
the program, what it asked for, the settings that lower it and the newest
complete save, which nothing after it has touched.
"""

import contextlib
import functools
import re

EXIT_CODE = 71  # EX_OSERR of sysexits.h: the system lacked a resource.
STATUS = 'RESOURCE_EXHAUSTED'
PROGRAMS = {
    'init': "creating the agent's parameters",
    'train': 'the train step',
    'report': 'the report',
    'policy': 'the policy',
}
# How an error of ours reads, also as the text of an RPC error or of a
# worker's exit summary.
_MARK = re.compile(
    r'[Oo]ut of device memory in (\w+)(?: \(asked for (\d+) bytes\))?')
# How XLA's allocators say what they were asked for.
_BYTES = (
    re.compile(r'\((\d+)B\)'),  # 'request for 2.00GiB (2147483648B)'
    re.compile(r'(\d+) bytes'),  # 'Out of memory allocating 4096 bytes'
)
_UNITS = {
    'K': 2 ** 10, 'M': 2 ** 20, 'G': 2 ** 30, 'T': 2 ** 40, 'P': 2 ** 50}
_SIZE = re.compile(r'allocate ([\d.]+) ?([KMGTP])i?B')  # '... allocate 8.00GiB'


class DeviceMemoryError(RuntimeError):
    """RESOURCE_EXHAUSTED in `program` (a key of PROGRAMS, or None where
    unknown); `requested` is the bytes it asked for, or None."""

    def __init__(self, program, requested, xla_message):
        self.program = program
        self.requested = requested
        self.xla_message = xla_message
        asked = f' (asked for {requested} bytes)' if requested else ''
        super().__init__(
            f'Out of device memory in {program or "a program"}{asked}: '
            f'{xla_message}')


def program(name):
    """A decorator: a RESOURCE_EXHAUSTED error raised by the function
    becomes a DeviceMemoryError naming `name`."""
    assert name in PROGRAMS, name

    def decorator(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except Exception as e:
                _raise_labeled(e, name)
                raise
        return wrapper
    return decorator


@contextlib.contextmanager
def in_program(name):
    """The context of `program(name)`."""
    assert name in PROGRAMS, name
    try:
        yield
    except Exception as e:
        _raise_labeled(e, name)
        raise


def _raise_labeled(error, name):
    """Raises a DeviceMemoryError naming `name` for `error` when it is XLA's
    RESOURCE_EXHAUSTED and names no program yet; returns otherwise."""
    if isinstance(error, DeviceMemoryError):
        return
    text = str(error)
    if STATUS in text and not _MARK.search(text):
        raise from_text(text, name) from error


def from_text(text, name=None):
    """The DeviceMemoryError that `text` (XLA's message) tells of."""
    return DeviceMemoryError(name, requested_bytes(text), _xla_line(text))


def find(error):
    """The DeviceMemoryError behind `error`: itself, its cause or context,
    or one that an RPC error or a worker's exit summary quotes (XLA's own
    RESOURCE_EXHAUSTED text too, of an unknown program); else None."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, DeviceMemoryError):
            return error
        text = str(error)
        match = _MARK.search(text)
        if match:
            rest = text[match.end():].lstrip(': ')
            return DeviceMemoryError(
                match.group(1) if match.group(1) in PROGRAMS else None,
                int(match.group(2)) if match.group(2) else None,
                _xla_line(rest))
        if STATUS in text:
            return from_text(text)
        error = error.__cause__ or error.__context__
    return None


def requested_bytes(text):
    """The bytes an XLA out-of-memory message says were asked for, or
    None where it names no amount."""
    for pattern in _BYTES:
        match = pattern.search(text)
        if match:
            return int(match.group(1))
    match = _SIZE.search(text)
    if match:
        return int(float(match.group(1)) * _UNITS[match.group(2)])
    return None


def _xla_line(text):
    """The line of `text` that holds the status (XLA adds allocator
    statistics below it), cut to a bounded length."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    line = next((x for x in lines if STATUS in x), lines[0] if lines else '')
    start = line.find(STATUS)
    line = line[start:] if start >= 0 else line
    return line if len(line) <= 300 else line[:300] + ' [...]'


def size_text(count):
    """`count` bytes for people: '16.0 GiB'."""
    for unit in ('PiB', 'TiB', 'GiB', 'MiB', 'KiB'):
        scale = _UNITS[unit[0]]
        if count >= scale:
            return f'{count / scale:.1f} {unit}'
    return f'{count} bytes'
