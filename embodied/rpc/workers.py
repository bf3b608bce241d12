"""Processes and threads that run one role of a launch.

    workers = [Process(fn, *args, name='Replay'), Thread(fn2, name='Agent')]
    [w.start() for w in workers]     # returns at once: children start together
    ...  # poll w.exitcode (None while running)
    [w.kill() for w in workers]

Like `portal.Process`, a process gets its function cloudpickled, inherits
`portal.setup()` options, and kills its own descendants when it ends. Unlike
it:

* `start()` does not wait for the child, so many children start concurrently.
* A child dies with its launcher however the launcher ends, SIGKILL included
  (Linux `PR_SET_PDEATHSIG`), so no child outlives its parent.
* The exit code is the function's int return value, else 0; `sys.exit(n)`
  gives n (portal turns even `sys.exit(0)` into 2); an exception gives 1 (or
  its int attribute `exitcode`) and prints its traceback under the worker's
  name; a write that found no room gives 74 and a device out of memory 71
  (`core.diskfull`, `core.outofmemory`), without a traceback: the launcher
  ends the run with one line; `PortTaken` gives `EXIT_PORT_TAKEN`, so the launcher can retry with
  other ports. The parent reads the exception's one-line summary from
  `error`, so a launcher can say why a worker ended.
* A child's stdout or stderr that loses its reader goes on in the file that
  the parent named for its own (`core.broken_streams`), so a print fails
  no worker.
* SIGINT and SIGTERM are ignored in children from their first instruction
  on (`core.signals`): the launcher receives them and stops the run in order
  (a Ctrl-C or a scheduler's SIGTERM reaches the whole process group).

A `Thread` has the same interface for roles that run in the launcher's process
(`run.agent_process False`); an exception ends the thread, not the process.
"""

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import traceback

import cloudpickle
import portal
import psutil

from embodied.core import broken_streams
from embodied.core import diskfull
from embodied.core import outofmemory
from embodied.core import linewise
from embodied.core import savetree
from embodied.core import signals

from . import addresses
from .client import Unreachable
from .supervisor import EXIT_PORT_TAKEN, exit_code

_PR_SET_PDEATHSIG = 1
_ERROR_CHARS = 2000  # Longest error summary a worker passes to its parent.


class Process:

    in_this_process = False

    def __init__(self, fn, *args, name=None):
        self.name = name or getattr(fn, '__name__', 'process')
        payload = cloudpickle.dumps((fn, args))
        context = multiprocessing.get_context('spawn')
        self._errors, self._errors_child = context.Pipe(duplex=False)
        self._error = None
        self.process = context.Process(
            target=_child_main, name=self.name,
            args=(payload, self.name, os.getpid(), portal.context.options(),
                  self._errors_child, broken_streams.fallback()))

    @property
    def pid(self):
        return self.process.pid

    @property
    def exitcode(self):
        """None while running, else the exit code (negative: by a signal)."""
        return self.process.exitcode

    @property
    def alive(self):
        return self.process.is_alive()

    @property
    def error(self):
        """One line on the exception that ended the process, or None."""
        if self._error is None and self.exitcode is not None:
            try:
                if self._errors.poll():
                    self._error = self._errors.recv()
            except (EOFError, OSError):
                pass
        return self._error

    def start(self):
        with signals.deferred():
            self.process.start()
        self._errors_child.close()  # The child holds its own copy.
        return self

    def join(self, timeout=None):
        self.process.join(timeout)
        return self.exitcode

    def kill(self):
        """SIGKILLs the process and everything it started (nothing when it
        never started)."""
        if self.pid is None:
            return
        kill_tree(self.pid)
        self.process.join(5)

    def __repr__(self):
        return f'Process({self.name}, pid={self.pid}, exitcode={self.exitcode})'


class Thread:

    in_this_process = True

    def __init__(self, fn, *args, name=None):
        self.name = name or getattr(fn, '__name__', 'thread')
        self._fn, self._args = fn, args
        self._exitcode = None
        self.error = None  # One line on the exception that ended it.
        self.exception = None  # That exception.
        self.thread = threading.Thread(
            target=self._main, name=self.name, daemon=True)
        self.thread.children = []  # Where portal registers its workers.

    @property
    def exitcode(self):
        return self._exitcode

    @property
    def alive(self):
        return self.thread.is_alive()

    def start(self):
        self.thread.start()
        return self

    def join(self, timeout=None):
        self.thread.join(timeout)
        return self.exitcode

    def kill(self):
        """Threads cannot be killed; a daemon thread ends with the process."""

    def _main(self):
        def call():
            try:
                return self._fn(*self._args)
            except BaseException as e:
                self.exception = e
                raise
        self._exitcode, self.error = _run(call, self.name)

    def __repr__(self):
        return f'Thread({self.name}, exitcode={self.exitcode})'


def kill_tree(pid):
    """SIGKILLs `pid` and its descendants, children first found. None (a
    process that never started) is nothing: psutil would take it for this
    process."""
    if pid is None:
        return
    try:
        parent = psutil.Process(pid)
        procs = parent.children(recursive=True) + [parent]
    except psutil.NoSuchProcess:
        return
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=5)


def die_with_parent(parent_pid):
    """Asks Linux to SIGKILL this process when its parent ends."""
    if sys.platform.startswith('linux'):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # The parent died before the prctl.
        os._exit(1)


def _child_main(payload, name, parent_pid, options, errors, fallback=None):
    die_with_parent(parent_pid)
    linewise.install()  # Whole lines in the log the processes share.
    broken_streams.set_fallback(fallback)
    signals.ignore_in_child()

    def main():
        portal.setup(**options)
        fn, args = cloudpickle.loads(payload)
        return fn(*args)

    code = 1
    try:
        code, error = _run(main, name)
        if error:
            errors.send(error)
    except Exception:
        pass  # The parent is gone; the exit code still tells.
    finally:
        for child in psutil.Process().children(recursive=True):
            kill_tree(child.pid)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _run(fn, name):
    """Runs a worker's function; returns its exit code (see the module
    docstring) and, when it raised, a summary of the error."""
    try:
        return _return_code(fn()), None
    except SystemExit as e:
        return _exit_code(e), None
    except addresses.PortTaken as e:
        print(f"'{name}': {e}", file=sys.stderr, flush=True)
        return EXIT_PORT_TAKEN, None
    except Unreachable as e:
        # A peer that never came or refused this run: the client printed
        # why, and the launcher ends the run with one line.
        return exit_code(e), summary(e)
    except BaseException as e:
        if diskfull.find(e) is not None:
            # The launcher ends the run with one line naming the path.
            return diskfull.EXIT_IO, summary(e)
        if outofmemory.find(e) is not None:
            # The launcher ends the run with one line naming the program.
            return outofmemory.EXIT_CODE, summary(e)
        if savetree.find(e) is not None:
            # A save() that holds what no save can: one line, the entry.
            return savetree.EXIT_CODE, summary(e)
        _print_error(name)
        return _error_code(e), summary(e)


def _return_code(value):
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return 0


def _exit_code(error):
    if error.code is None:
        return 0
    if isinstance(error.code, int):
        return error.code
    print(error.code, file=sys.stderr, flush=True)
    return 1


def summary(error):
    """`Type: message` of an exception, cut to a bounded length."""
    text = f'{type(error).__name__}: {error}'
    if len(text) > _ERROR_CHARS:
        text = text[:_ERROR_CHARS] + ' [...]'
    return text


def _error_code(error):
    code = getattr(error, 'exitcode', None)
    if isinstance(code, int) and not isinstance(code, bool) and code:
        return code
    return 1


def _print_error(name):
    text = traceback.format_exc()
    print(f"Error in '{name}':\n{text}", file=sys.stderr, flush=True)
