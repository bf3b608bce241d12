"""A write that found no room: a full disk, a quota, a read-only logdir.

    with diskfull.writing(path):      # names `path` on an error without one
        f.write(content)
    error = diskfull.find(exception)  # the OSError, also inside an RPC error
    line = diskfull.message(error, logdir, last_save)

A run that meets one ends with `EXIT_IO` (74, EX_IOERR) and the single line
from `message`: the path it could not write, the bytes free on that file
system, and the newest complete save, which the failed write left intact
(saves are written to a temporary folder and renamed into place only once
complete, see `checkpoint`).
"""

import contextlib
import errno
import os
import re

EXIT_IO = 74  # EX_IOERR of sysexits.h.
ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
_WHAT = {
    errno.ENOSPC: 'no space left on device',
    errno.EDQUOT: 'disk quota exceeded',
    errno.EROFS: 'read-only file system',
}
_FIX = {errno.EROFS: 'the file system is writable'}

# How Python prints an OSError; errors that crossed a process boundary
# (an RPC reply, a worker's exit summary) arrive as this text.
_TEXT = re.compile(
    r"\[Errno (\d+)\] ([^:\]]+?)(?:: '((?:[^'\\]|\\.)*)')?(?:$|[;\n)])")


def is_full(error):
    return isinstance(error, OSError) and error.errno in ERRNOS


@contextlib.contextmanager
def writing(path):
    """Has a disk-full error raised inside name `path`: a `write` or `fsync`
    names no file, and an `open` names a temporary one."""
    try:
        yield
    except OSError as e:
        if is_full(e) and e.filename != str(path):
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise


def find(error):
    """The disk-full OSError behind `error`: itself, its cause or context,
    or one that an RPC error or a worker's exit summary quotes; else None."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if is_full(error):
            return error
        quoted = _from_text(str(error))
        if quoted:
            return quoted
        error = error.__cause__ or error.__context__
    return None


def _from_text(text):
    for match in _TEXT.finditer(text):
        code = int(match.group(1))
        if code in ERRNOS:
            filename = match.group(3)
            return OSError(code, match.group(2), filename) if filename else (
                OSError(code, match.group(2)))
    return None


def free_bytes(path):
    """Bytes an unprivileged writer may still use on the file system of
    `path` (its nearest existing folder), or None."""
    path = os.path.abspath(str(path))
    while path and not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def message(error, logdir, last_save):
    """The one line a run prints when `error` (a disk-full OSError) ends it;
    `last_save` is the newest complete save's tag, or None."""
    path = error.filename or str(logdir)
    free = free_bytes(path)
    free = 'unknown' if free is None else f'{free} bytes'
    what = _WHAT.get(error.errno, error.strerror)
    folder = os.path.join(str(logdir), 'ckpt')
    if last_save is None:
        saved = (f'there is no complete save in {folder} yet, so a rerun '
                 f'starts from the beginning')
    else:
        saved = (f'the last complete save, step {last_save} in {folder}, '
                 f'is intact and a rerun of the same command resumes from it '
                 f'once {_FIX.get(error.errno, "there is space")}')
    return (f'Could not write {path} ({what}; {free} free on that file '
            f'system): {saved}. Exiting with code {EXIT_IO}.')

