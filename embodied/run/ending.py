"""Errors that a user fixes outside the run end it with one line and an exit
code, not a traceback: a peer that refused this command or never came
(`rpc.Refused` 77, `rpc.Unreachable` 69, also when a role of this
command met it) and a write that found no room
(`core.diskfull`, 74). The runners apply it themselves, so a script that
calls them directly (the original's dreamerv3/main.py) ends the same way as
`python -m embodied.main`.

    @ending.in_one_line
    def train(make_agent, ..., args): ...

    with ending.one_line(args):
        ...
"""

import contextlib
import functools
import sys

from embodied.core import diskfull
from embodied.run import saving


def disk_full_line(args, error):
    """The line for `error`, a write that found no room, naming the newest
    complete save in `args.logdir`."""
    last = saving.resume_tag(
        args.logdir, report=False, replica=saving.replica_of(args),
        agree=False)
    return diskfull.message(error, args.logdir, last)


@contextlib.contextmanager
def one_line(args):
    """Turns those errors into `error: <line>` on stderr and SystemExit
    with their code. With several replicas a disk-full error is left to
    the caller, which ends every replica (`embodied.main`)."""
    try:
        yield
    except Exception as e:
        # Only a process that imported the RPC layer meets its errors.
        rpc = sys.modules.get('embodied.rpc')
        if rpc and isinstance(e, rpc.Unreachable):
            print(f'error: {e}', file=sys.stderr, flush=True)
            raise SystemExit(rpc.supervisor.exit_code(e)) from None
        if rpc and isinstance(e, rpc.WorkerFailed) and e.exitcode in (
                rpc.supervisor.EXIT_UNREACHABLE, rpc.supervisor.EXIT_REFUSED):
            # A role of this command gave up on a peer of another command.
            print(f'error: {e}', file=sys.stderr, flush=True)
            raise SystemExit(e.exitcode) from None
        full = diskfull.find(e)
        if full is None or int(args.get('replicas', 1)) > 1:
            raise
        print(f'error: {disk_full_line(args, full)}', file=sys.stderr,
              flush=True)
        raise SystemExit(diskfull.EXIT_IO) from None


def in_one_line(runner):
    """A runner (its last argument `args`) that ends like `one_line`."""
    @functools.wraps(runner)
    def wrapper(*fargs, **kwargs):
        args = kwargs['args'] if 'args' in kwargs else fargs[-1]
        with one_line(args):
            return runner(*fargs, **kwargs)
    return wrapper
