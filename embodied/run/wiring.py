"""What the roles of the parallel runner share: factories sent to worker
processes as bytes, clients of other roles with a bounded connect, metric
prefixes."""

import cloudpickle
import portal

from embodied import rpc

STOP_KEY = '__stop__'       # in an act reply: the env worker should exit


# The roles whose `run.remote_*` flag says they run elsewhere.
REMOTE_FLAGS = {'replay': 'remote_replay', 'actor': 'remote_envs'}


def is_remote(args, role):
    """Whether `role`'s server runs apart from this launch: flagged so
    (`run.remote_replay`, `run.remote_envs`) or at an address naming a host
    other than this one's loopback."""
    if args.get(REMOTE_FLAGS.get(role, ''), False):
        return True
    host, _ = rpc.addresses.split(args[f'{role}_addr'])
    return host not in ('', 'localhost', 'ip6-localhost', '127.0.0.1', '::1')


def connect_timeout(args, role):
    """Seconds to wait for `role`'s server: run.connect_timeout for a remote
    role; None (no limit) for one this launch started, which may be slow to
    come up on a busy machine or while the agent compiles, and whose death
    the launcher notices on its own."""
    return args.connect_timeout if is_remote(args, role) else None


def connect(args, role, name, **kwargs):
    """A client of `role`'s server; `Unreachable` after run.connect_timeout
    when the role is remote, with a report every run.wait_report seconds
    while it waits."""
    return rpc.connect(
        args[f'{role}_addr'], name, connect_timeout(args, role),
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
