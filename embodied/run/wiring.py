"""What the roles of the parallel runner share: factories sent to worker
processes as bytes, clients of other roles with a bounded connect, metric
prefixes."""

import cloudpickle
import portal

from embodied import rpc

STOP_KEY = '__stop__'       # in an act reply: the env worker should exit


def connect(args, role, name, **kwargs):
    """A client of `role`'s server; `Unreachable` after run.connect_timeout,
    with a report every run.wait_report seconds while it waits."""
    return rpc.connect(
        args[f'{role}_addr'], name, args.connect_timeout,
        report_every=args.wait_report, **kwargs)


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
