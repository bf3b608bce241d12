"""What a process does when its stdout or stderr loses its reader: a pipe
whose reading end closed (the program that read it ended or was killed,
`| head` has read enough) or a terminal that hung up.

A write to such a stream fails (Python ignores SIGPIPE, so EPIPE comes as a
`BrokenPipeError`; a hung-up terminal gives EIO), and that exception, out
of any `print` of any thread, would end the thread or the run in the middle
of what it does. Instead, the process's line writers (`linewise`) hand the
failure here: the stream's file descriptor is pointed at the fallback file
(`set_fallback`; /dev/null without one), so that every later write to it,
Python's, a native library's and the interpreter's last flush alike, lands
there; the text that failed is written again there; and the listeners
(`on_lost`) are told once. A stream of the process on the same pipe goes
with it. The fallback file gets one line first, naming the process and the
streams. `poll()` notices a pipe whose reader closed without writing to it.

    broken_streams.set_fallback(f'{logdir}/{broken_streams.FILENAME}')
    broken_streams.on_lost(lambda names, why: ...)   # e.g. stop and save
    broken_streams.poll()                            # now and then
"""

import errno
import multiprocessing
import os
import select
import stat
import threading
import time

FILENAME = 'broken_pipe.log'  # The fallback in a run's logdir.

# A reader gone: EPIPE (and ESHUTDOWN, which Python also makes a
# BrokenPipeError) for a pipe or socket, EIO for a terminal that hung up.
_LOST = {errno.EPIPE: 'broken pipe', errno.ESHUTDOWN: 'broken pipe',
         errno.EIO: 'the terminal hung up'}
_NAMES = {1: 'stdout', 2: 'stderr'}

_lock = threading.RLock()
_fallback = None
_listeners = []
_lost = {}       # fd -> why, for the descriptors pointed at the fallback
_pending = []    # (names, why) not yet told to the listeners


def set_fallback(path):
    """Where a stream that lost its reader goes from then on (appended to;
    None: /dev/null). Returns the previous setting. Worker processes of
    `rpc.workers` inherit it."""
    global _fallback
    with _lock:
        previous, _fallback = _fallback, (str(path) if path else None)
    return previous


def fallback():
    """The file set by `set_fallback`, or None."""
    return _fallback


def on_lost(listener):
    """Calls `listener(names, why)` once for each loss: the names of the
    streams ('stdout', 'stderr') that lost their reader together and why
    ('broken pipe', ...), from the thread that met it, with no stream's
    lock held. Returns a function that removes the listener."""
    with _lock:
        _listeners.append(listener)

    def remove():
        with _lock:
            if listener in _listeners:
                _listeners.remove(listener)
    return remove


def lost():
    """The names of the streams that lost their reader so far."""
    with _lock:
        return [_NAMES.get(fd, f'fd {fd}') for fd in sorted(_lost)]


def why_lost():
    """Why the first of them lost it ('broken pipe', ...), or None."""
    with _lock:
        return _lost[min(_lost)] if _lost else None


def handle(fd, error):
    """Called by a writer whose write to descriptor `fd` raised `error`:
    True when the reader is gone and `fd` now points at the fallback (the
    caller writes again), False for any other error (the caller raises
    it). The listeners hear of it at the next `notify()`."""
    why = _LOST.get(getattr(error, 'errno', None))
    if why is None or fd is None:
        return False
    _lose([fd], why)
    return True


def poll():
    """Notices stdout and stderr pipes whose reader closed, without writing
    to them (Linux reports such a pipe as an error to `poll`); handles them
    as `handle` would and tells the listeners. Returns the names lost now."""
    gone = []
    with _lock:
        for fd in _NAMES:
            if fd in _lost or not _is_pipe(fd):
                continue
            poller = select.poll()
            poller.register(fd, select.POLLOUT)
            try:
                events = poller.poll(0)
            except OSError:
                continue
            if any(mask & select.POLLERR for _, mask in events):
                gone.append(fd)
        if gone:
            _lose(gone, 'pipe closed by its reader')
    notify()
    return [_NAMES[fd] for fd in gone]


def notify():
    """Tells the listeners of the losses not told yet. Writers call it
    after releasing their own lock (a listener may print)."""
    if not _pending:
        return
    with _lock:
        pending = list(_pending)
        _pending.clear()
        listeners = list(_listeners)
    for names, why in pending:
        for listener in listeners:
            listener(names, why)


def _lose(fds, why):
    with _lock:
        fds = [fd for fd in fds if fd not in _lost]
        if not fds:
            return
        same = {_identity(fd) for fd in fds} - {None}
        for fd in _NAMES:  # The streams on the same pipe go with it.
            if fd not in _lost and fd not in fds and _identity(fd) in same:
                fds.append(fd)
        fds.sort()
        target = _open_fallback()
        names = [_NAMES.get(fd, f'fd {fd}') for fd in fds]
        try:
            for fd in fds:
                os.dup2(target, fd)
                _lost[fd] = why
            os.write(target, _note(names, why).encode())
        except OSError:
            pass
        finally:
            os.close(target)
        _pending.append((names, why))


def _open_fallback():
    if _fallback:
        try:
            os.makedirs(os.path.dirname(_fallback) or '.', exist_ok=True)
            return os.open(
                _fallback, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError:
            pass
    return os.open(os.devnull, os.O_WRONLY)


def lost_text(names, why):
    """'stdout and stderr lost their reader (broken pipe)'."""
    verb = 'lost their reader' if len(names) > 1 else 'lost its reader'
    return f'{" and ".join(names)} {verb} ({why})'


def _note(names, why):
    name = multiprocessing.current_process().name
    who = 'the main process' if name == 'MainProcess' else name
    stamp = time.strftime('%Y-%m-%d %H:%M:%S')
    them = 'them' if len(names) > 1 else 'it'
    return (f'{stamp} {who} (pid {os.getpid()}): its '
            f'{lost_text(names, why)}; what it writes to {them} goes to this '
            f'file from now on.\n')


def _identity(fd):
    try:
        info = os.fstat(fd)
    except OSError:
        return None
    return (info.st_dev, info.st_ino)


def _is_pipe(fd):
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def descriptor(stream):
    """The file descriptor under `stream`, or None (a stream without one,
    e.g. a test's capture)."""
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None

