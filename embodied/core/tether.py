"""Python commands started as children that end with their parent, however
the parent ends, SIGKILL included.

A benchmark or a sweep starts runs as child processes and reads their
output through a pipe. Killed, it would leave them running: reparented to
init, writing to a pipe nobody reads. So the tools start their runs here:

    proc = tether.popen(['-m', 'embodied.run.parallel', *flags],
                        stdout=subprocess.PIPE, text=True)
    while tether.running(proc): ...   # unlike proc.poll(), reaps nothing
    tether.end(proc)                  # the run and its process group

    with tether.started(['-c', CODE, *args], stdout=log) as proc: ...
    result = tether.run(['-c', CODE, *args], timeout=600,
                        capture_output=True, text=True)

How it works:

* The child leads a process group (a session) of its own, so the run, its
  workers and whatever they start are one group that one signal reaches.
* The parent keeps the writing end of a pipe, the lifeline, that nothing
  ever writes to; the child gets its reading end. The kernel closes the
  writing end when the parent ends, however it ends, so the reading end
  sees an end of file then, and at `end` (which closes it too).
* The interpreter runs a short bootstrap first. It forks a watchdog
  (before any thread exists), then runs the module or the code as
  `python -m` or `python -c` would. The bootstrap needs nothing from
  embodied, so a run of another checkout (`--old REV`) is tethered too.
  The watchdog, in the group, on /dev/null, ignoring SIGTERM, waits on the
  lifeline. At its end of file it sends SIGTERM to the group (a run stops
  after its current step, saves and exits; its workers die with their
  launcher, `rpc.workers`), and SIGKILL to the group, itself included,
  once the command ended or `grace` seconds passed, whichever comes first.
  A command that ends by itself while its parent lives ends the watchdog
  too (it sees its own parent change within `POLL` seconds), which
  SIGKILLs what is left of the group `LINGER` seconds later. Being in the
  group, the watchdog keeps its id from naming any other group meanwhile.
* `end(proc)`, and `run` and `started` on their way out (a timeout, an
  exception, Ctrl-C), do the same from the parent: SIGTERM to the group,
  SIGKILL after `grace` (0: at once), then close the lifeline.

A watchdog rather than prctl(PR_SET_PDEATHSIG): Linux sends that signal
when the *thread* that started the child ends, not the process, so a child
started from a worker thread (a sweep running several at once) would die
with that thread; and it reaches one process, not the group of a run whose
launcher died before its grandchildren. Linux and macOS.
"""

import contextlib
import os
import signal
import subprocess
import sys
import time

GRACE = 60.0  # Seconds from the SIGTERM to the SIGKILL of what is left.
POLL = 0.2    # Seconds between the watchdog's looks at the command.

LINGER = 1.0  # Seconds the group of a command that ended gets to exit.

# argv: lifeline fd, grace, poll, '-m' or '-c', module or code, its args.
BOOTSTRAP = r'''
import os, select, signal, sys
_tether_linger = %s
def _tether_watchdog(lifeline, leader, grace, poll):
    import time
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    while not select.select([lifeline], [], [], poll)[0]:
        if os.getppid() != leader:  # The command ended by itself: what is
            time.sleep(_tether_linger)  # left of its group goes after a
            break                       # moment.
    else:  # The parent is gone, or ended the command.
        send = os.killpg if os.getpgrp() == leader else os.kill
        try:
            send(leader, signal.SIGTERM)
        except OSError:
            pass
        deadline = time.monotonic() + grace
        while os.getppid() == leader and time.monotonic() < deadline:
            time.sleep(poll)
    if os.getpgrp() == leader:  # Its group, this watchdog included.
        os.killpg(leader, signal.SIGKILL)
    elif os.getppid() == leader:
        os.kill(leader, signal.SIGKILL)
_tether_lifeline = int(sys.argv[1])
if os.fork() == 0:
    try:
        _tether_watchdog(_tether_lifeline, os.getppid(), float(sys.argv[2]),
                         float(sys.argv[3]))
    finally:
        os._exit(0)
os.close(_tether_lifeline)
_tether_kind, _tether_what = sys.argv[4], sys.argv[5]
if _tether_kind == '-m':
    import runpy
    sys.argv = [_tether_what, *sys.argv[6:]]
    sys.path[0] = os.getcwd()
    runpy.run_module(_tether_what, run_name='__main__', alter_sys=True)
else:
    sys.argv = ['-c', *sys.argv[6:]]
    exec(compile(_tether_what, '<string>', 'exec'))
'''


def command(args, lifeline, grace=GRACE, python=None):
    """The argv that runs `python *args` tethered to the pipe's reading
    end `lifeline` (a descriptor the child inherits); `args` start with
    '-m MODULE' or '-c CODE'."""
    args = [str(x) for x in args]
    if len(args) < 2 or args[0] not in ('-m', '-c'):
        raise ValueError(
            f"tether runs Python commands that start with '-m MODULE' or "
            f"'-c CODE', not {args[:2]}")
    return [python or sys.executable, '-c', BOOTSTRAP % LINGER, str(lifeline),
            str(float(grace)), str(POLL), *args]


def popen(args, grace=GRACE, python=None, **kwargs):
    """`subprocess.Popen` of `python *args`, tethered (see the module
    docstring); `kwargs` go to Popen. Call `end` when done with it: the
    lifeline's descriptor stays open until then (`proc.lifeline`)."""
    read, write = os.pipe()
    kwargs['start_new_session'] = True
    kwargs['pass_fds'] = (*kwargs.get('pass_fds', ()), read)
    try:
        proc = subprocess.Popen(
            command(args, read, grace, python), **kwargs)
    except BaseException:
        os.close(write)
        raise
    finally:
        os.close(read)
    proc.lifeline = write
    return proc


def running(proc):
    """Whether `proc` has not exited yet, without reaping it (its pid then
    still names its process group for `end`)."""
    if proc.returncode is not None:
        return False
    try:
        info = os.waitid(
            os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return info is None


def end(proc, grace=GRACE):
    """Ends `proc` (from `popen`) and every process of its group: SIGTERM,
    then SIGKILL `grace` seconds later (0: SIGKILL at once) to what is
    left; returns its exit code. A `proc` already reaped (`poll`, `wait`)
    leaves its group alone: its pid may name another process by now."""
    if proc.returncode is None:
        if grace > 0 and running(proc):
            _signal_group(proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while running(proc) and time.monotonic() < deadline:
                time.sleep(0.05)
        # Exited or not, it is not reaped: its pid still names the group.
        _signal_group(proc.pid, signal.SIGKILL)
    code = proc.wait()
    _cut(proc)
    return code


@contextlib.contextmanager
def started(args, grace=GRACE, python=None, **kwargs):
    """`popen` as a context: on the way out, however it goes, `end`."""
    proc = popen(args, grace, python, **kwargs)
    try:
        yield proc
    finally:
        end(proc, grace)


def run(args, timeout=None, grace=GRACE, python=None, input=None,
        check=False, **kwargs):
    """`subprocess.run` of `python *args`, tethered; `capture_output`,
    `text`, `stdout`, `env`, `cwd`, ... as there. Past `timeout` the group
    is SIGKILLed and `subprocess.TimeoutExpired` raised, as there."""
    if kwargs.pop('capture_output', False):
        kwargs['stdout'] = kwargs['stderr'] = subprocess.PIPE
    if input is not None:
        kwargs['stdin'] = subprocess.PIPE
    proc = popen(args, grace, python, **kwargs)
    try:
        stdout, stderr = proc.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        _signal_group(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        _cut(proc)
        raise subprocess.TimeoutExpired(
            proc.args, timeout, output=stdout, stderr=stderr) from e
    except BaseException:
        end(proc, grace)
        raise
    _cut(proc)
    result = subprocess.CompletedProcess(
        proc.args, proc.returncode, stdout, stderr)
    if check:
        result.check_returncode()
    return result


def _cut(proc):
    """Closes the lifeline of `proc`: its watchdog ends what is left."""
    lifeline, proc.lifeline = getattr(proc, 'lifeline', None), None
    if lifeline is not None:
        os.close(lifeline)


def _signal_group(pid, signum):
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass
