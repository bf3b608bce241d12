"""Errors that a user fixes outside the run end it with one line and an exit
code, not a traceback: a peer that refused this command or never came
(`rpc.Refused` 77, `rpc.Unreachable` 69, also when a role of this
command met it), a write that found no room (`core.diskfull`, 74), a
program that asked a device for more memory than it has
(`core.outofmemory`, 71), and saves that cannot be read or written
without a pickle (`checkpoint.PickleSave`, `savetree.Unsavable`, 2). The runners apply it themselves, so a script that
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

from embodied.core import checkpoint as cplib
from embodied.core import diskfull
from embodied.core import outofmemory
from embodied.core import savetree
from embodied.run import arguments
from embodied.run import saving

# The settings that lower what each program asks of a device, beyond the
# model's size; `{...}` are the run's values.
_SMALLER = {
    'train': '--batch_size (now {batch_size}) or --batch_length (now '
             '{batch_length})',
    'report': '--report_length (now {report_length}) or --batch_size (now '
              '{batch_size})',
    'policy': '--run.actor_batch (now {actor_batch}; --script parallel) or '
              '--run.envs (now {envs})',
}
_MESH = {
    'policy': '--jax.policy_mesh and --jax.policy_devices',
    'train': '--jax.train_mesh 1,N,1 (FSDP over N devices)',
}


def disk_full_line(args, error):
    """The line for `error`, a write that found no room, naming the newest
    complete save in `args.logdir`."""
    last = saving.resume_tag(
        args.logdir, report=False, replica=saving.replica_of(args),
        agree=False)
    return diskfull.message(error, args.logdir, last)


def out_of_memory_line(args, error):
    """The line for `error`, a `outofmemory.DeviceMemoryError`: the
    program, what it asked for, the settings that lower it and the newest
    complete save in `args.logdir`."""
    program = error.program
    what = outofmemory.PROGRAMS.get(program, 'a program of the agent')
    asked = (f'it asked for {outofmemory.size_text(error.requested)} '
             f'({error.requested} bytes)' if error.requested else
             'XLA named no amount')
    values = dict(arguments.normalize(args))
    smaller = _SMALLER.get(program, _SMALLER['train']).format(**values)
    mesh = _MESH.get(program, _MESH['train'])
    knobs = (f'{smaller}, a smaller model (--configs size12m or another '
             f'size block), --jax.prealloc False (JAX then allocates as '
             f'needed instead of reserving most of the GPU at start, so '
             f'other processes on it keep room){_share(program, values)}, '
             f'or spread it over more devices with {mesh} '
             f'(docs/devices.md)')
    return (f'Out of device memory in {what} ({asked}; '
            f'{error.xla_message}). Lower it with {knobs}. '
            f'{_saved_text(args)}. Exiting with code '
            f'{outofmemory.EXIT_CODE}.')


def _share(program, values):
    """With the policy in a process of its own, the GPU share of the
    process that ran `program`, as a setting to raise."""
    if values.get('policy_worker') != 'process':
        return ''
    key = 'policy_memory' if program == 'policy' else 'agent_memory'
    return (f', a larger share of the GPU for its process, --run.{key} '
            f'(now {values[key]}; --run.policy_worker process)')


def _saved_text(args):
    folder = f'{args.logdir}/ckpt'
    last = saving.resume_tag(
        args.logdir, report=False, replica=saving.replica_of(args),
        agree=False)
    if last is None:
        return f'There is no complete save in {folder} yet'
    return (f'The last complete save, step {last} in {folder}, is intact '
            f'and a rerun of the same command resumes from it')


@contextlib.contextmanager
def one_line(args):
    """Turns those errors into `error: <line>` on stderr and SystemExit
    with their code. With several replicas a disk-full or out-of-memory
    error is left to the caller, which ends every replica
    (`embodied.main`)."""
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
        refused = e if isinstance(e, cplib.PickleSave) else savetree.find(e)
        if refused is not None:
            print(f'error: {refused}', file=sys.stderr, flush=True)
            raise SystemExit(savetree.EXIT_CODE) from None
        if int(args.get('replicas', 1)) > 1:
            raise
        full = diskfull.find(e)
        if full is not None:
            print(f'error: {disk_full_line(args, full)}', file=sys.stderr,
                  flush=True)
            raise SystemExit(diskfull.EXIT_IO) from None
        memory = outofmemory.find(e)
        if memory is not None:
            print(f'error: {out_of_memory_line(args, memory)}',
                  file=sys.stderr, flush=True)
            raise SystemExit(outofmemory.EXIT_CODE) from None
        raise


def in_one_line(runner):
    """A runner (its last argument `args`) that ends like `one_line`."""
    @functools.wraps(runner)
    def wrapper(*fargs, **kwargs):
        args = kwargs['args'] if 'args' in kwargs else fargs[-1]
        with one_line(args):
            return runner(*fargs, **kwargs)
    return wrapper
