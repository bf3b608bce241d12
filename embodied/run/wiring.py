"""What the roles of the parallel runner share: the `args` keys it adds
(with defaults), factories sent to worker processes as bytes, and clients of
other roles with a bounded connect."""

import cloudpickle
import elements
import portal

from embodied import rpc

# Keys this runner reads beyond the original's `args`, with their defaults.
DEFAULTS = dict(
    envs_per_worker=1,      # envs stepped by one env worker process
    env_restarts=10,        # restarts of a crashed env worker
    wait_report=30,         # seconds before a wait is reported
    connect_timeout=120,    # seconds to reach another role
    actor_flush=0.02,       # seconds before a partial policy batch runs
    save_keep=3,            # checkpoints kept per role
    drain_timeout=30,       # seconds a save waits for transitions in flight
    shared_batches=True,    # train batches through /dev/shm on one machine
)

STOP_KEY = '__stop__'       # in an act reply: the env worker should exit


def connect(args, role, name, **kwargs):
    """A client of `role`'s server; `Unreachable` after run.connect_timeout,
    with a report every run.wait_report seconds while it waits."""
    return rpc.connect(
        args[f'{role}_addr'], name, args.connect_timeout,
        report_every=args.wait_report, **kwargs)


def complete(args):
    """`args` with defaults for the keys this runner adds."""
    missing = {k: v for k, v in DEFAULTS.items() if k not in args}
    if not missing:
        return args
    return elements.Config({**missing, **args})


def prefix(metrics, name):
    """`metrics` with keys `name/key`."""
    return {f'{name}/{k}': v for k, v in metrics.items()}


def ipv6(args):
    """Whether servers and clients use IPv6 (`ipv6` or portal's setup)."""
    return bool(args.get('ipv6', portal.context.serverkw.get('ipv6', False)))


def dumps(fn):
    """A factory as bytes, so a worker process can receive it."""
    return fn if isinstance(fn, bytes) else cloudpickle.dumps(fn)


def loads(fn):
    """A factory from `dumps` (or as given when it is no bytes)."""
    return cloudpickle.loads(fn) if isinstance(fn, bytes) else fn
