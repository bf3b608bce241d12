"""Keeps a run's child processes alive through the stop signals.

Schedulers (Slurm, Kubernetes, systemd, `timeout`) send SIGTERM to the whole
process group, often more than once, and a Ctrl-C sends SIGINT to the whole
group. Only the launcher of a run decides how to stop: it saves and then ends
its children itself. So a child ignores both signals from its first
instruction on:

    with signals.deferred():        # in the parent, around the spawn
        process.start()
    ...
    signals.ignore_in_child()       # first thing in the child

A spawned child runs the interpreter's start-up before any of its own code;
`deferred` blocks the two signals in the spawning thread meanwhile, so the
child starts with them blocked (the mask survives fork and exec) and cannot
be killed in that window. The parent's own signals arriving meanwhile stay
pending and are delivered when the block ends.
"""

import contextlib
import signal
import threading

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def deferred():
    """Blocks SIGINT and SIGTERM in this thread while children are spawned."""
    if not hasattr(signal, 'pthread_sigmask'):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def ignore_in_child():
    """Ignores SIGINT and SIGTERM in this (child) process, then unblocks
    them, so that what it starts inherits the ignoring, not the block."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    if hasattr(signal, 'pthread_sigmask'):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
