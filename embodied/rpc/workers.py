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
  gives n (portal turns even `sys.exit(0)` into 2); an exception gives 1 and
  prints its traceback under the worker's name; `PortTaken` gives
  `EXIT_PORT_TAKEN`, so the launcher can retry with other ports.
* SIGINT and SIGTERM are ignored in children: the launcher receives them and
  stops the run in order (a Ctrl-C reaches the whole process group).

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

from . import addresses
from .supervisor import EXIT_PORT_TAKEN

_PR_SET_PDEATHSIG = 1


class Process:

    def __init__(self, fn, *args, name=None):
        self.name = name or getattr(fn, '__name__', 'process')
        payload = cloudpickle.dumps((fn, args))
        context = multiprocessing.get_context('spawn')
        self.process = context.Process(
            target=_child_main, name=self.name,
            args=(payload, self.name, os.getpid(), portal.context.options()))

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

    def start(self):
        self.process.start()
        return self

    def join(self, timeout=None):
        self.process.join(timeout)
        return self.exitcode

    def kill(self):
        """SIGKILLs the process and everything it started."""
        kill_tree(self.pid)
        self.process.join(5)

    def __repr__(self):
        return f'Process({self.name}, pid={self.pid}, exitcode={self.exitcode})'


class Thread:

    def __init__(self, fn, *args, name=None):
        self.name = name or getattr(fn, '__name__', 'thread')
        self._fn, self._args = fn, args
        self._exitcode = None
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
        try:
            self._exitcode = _return_code(self._fn(*self._args))
        except SystemExit as e:
            self._exitcode = _exit_code(e)
        except addresses.PortTaken as e:
            print(f"'{self.name}': {e}", file=sys.stderr, flush=True)
            self._exitcode = EXIT_PORT_TAKEN
        except BaseException:
            _print_error(self.name)
            self._exitcode = 1

    def __repr__(self):
        return f'Thread({self.name}, exitcode={self.exitcode})'


def kill_tree(pid):
    """SIGKILLs `pid` and its descendants, children first found."""
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


def _child_main(payload, name, parent_pid, options):
    die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    code = 1
    try:
        portal.setup(**options)
        fn, args = cloudpickle.loads(payload)
        code = _return_code(fn(*args))
    except SystemExit as e:
        code = _exit_code(e)
    except addresses.PortTaken as e:
        print(f"'{name}': {e}", file=sys.stderr, flush=True)
        code = EXIT_PORT_TAKEN
    except BaseException:
        _print_error(name)
        code = 1
    finally:
        for child in psutil.Process().children(recursive=True):
            kill_tree(child.pid)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


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


def _print_error(name):
    text = traceback.format_exc()
    print(f"Error in '{name}':\n{text}", file=sys.stderr, flush=True)
