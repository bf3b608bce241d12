"""Whole lines on stdout and stderr, however many threads print.

`print(text)` writes `text` and then the newline in two calls, so a line of
one thread can end up glued to another's (`... a cold start).Workers: ...`)
and the processes sharing a terminal or a job's log interleave mid-line
the same way. `install()` wraps both streams so that each thread's text is
held until it ends a line and every line goes out in one write:

    linewise.install()   # once, at the start of a process

A stream whose reader went away (a closed pipe, a hung-up terminal) fails
no `print`: the writer hands it to `broken_streams`, which points it at a
file, and writes the text again there.
"""

import sys
import threading

from embodied.core import broken_streams


class LineWriter:
    """A text stream's writer that writes whole lines only, each in one
    call of the wrapped stream's `write`; what a thread wrote after its
    last newline waits for the next newline or `flush()`."""

    def __init__(self, stream):
        self.stream = stream
        self._local = threading.local()
        # Reentrant: a signal handler that prints runs on the thread it
        # interrupted, which may hold it.
        self._lock = threading.RLock()

    def write(self, text):
        pending = getattr(self._local, 'pending', '') + text
        lines, newline, rest = pending.rpartition('\n')
        # Kept before writing: a listener told below (or a signal handler)
        # may print on this thread.
        self._local.pending = rest
        if newline:
            with self._lock:
                self._call(self.stream.write, lines + newline)
            broken_streams.notify()
        return len(text)

    def flush(self):
        rest = getattr(self._local, 'pending', '')
        self._local.pending = ''
        with self._lock:
            if rest:
                self._call(self.stream.write, rest)
            self._call(self.stream.flush)
        broken_streams.notify()

    def _call(self, method, *args):
        """`method(*args)`, and once more after `broken_streams` pointed a
        stream that lost its reader at its fallback (a failed write leaves
        none of its text in the stream's buffers: no line comes twice)."""
        try:
            return method(*args)
        except OSError as e:
            fd = broken_streams.descriptor(self.stream)
            if not broken_streams.handle(fd, e):
                raise
        return method(*args)

    def __getattr__(self, name):  # fileno, encoding, isatty, buffer, ...
        return getattr(self.stream, name)


def install():
    """Wraps `sys.stdout` and `sys.stderr` (once) in a `LineWriter`."""
    for name in ('stdout', 'stderr'):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, LineWriter):
            setattr(sys, name, LineWriter(stream))
