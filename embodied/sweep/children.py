"""Runs as child processes that do not outlive the sweep.

Each child leads a process group of its own (a new session), so that one
signal reaches the run and every process it started (env workers, replay,
logger), and a Ctrl-C in the terminal reaches only the sweep, which then
stops each run the way the run expects (SIGTERM to its group: stop after
the current step, save, exit 0). On Linux the child also asks the kernel
for a SIGTERM when the sweep dies (prctl PR_SET_PDEATHSIG), so a sweep
killed by SIGKILL still stops its runs with their final saves.
"""

import ctypes
import os
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1


def start(argv, output, env=None, cwd=None):
    """Starts `argv` with stdout and stderr appended to the file `output`,
    as a process group of its own that gets SIGTERM if this process dies;
    returns the Popen."""
    parent = os.getpid()

    def setup():  # In the child, between fork and exec.
        _ask_for_death_signal()
        if os.getppid() != parent:  # The sweep died before the prctl.
            os._exit(1)

    with open(output, 'ab') as f:
        return subprocess.Popen(
            argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env=env, cwd=cwd,
            preexec_fn=setup if sys.platform.startswith('linux') else None)


def _ask_for_death_signal():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        pass  # Without it, only a sweep that can run its handlers stops them.


def signal_group(proc, signum):
    """Sends `signum` to every process of the child's group."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signum)
    except ProcessLookupError:
        pass


def stop(procs, timeout=120):
    """Asks every child's group to stop (SIGTERM), waits up to `timeout`
    seconds for the children, then kills the groups of those left; used
    when the sweep leaves without having stopped them."""
    import time
    for proc in procs:
        signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            signal_group(proc, signal.SIGKILL)
            proc.wait()
