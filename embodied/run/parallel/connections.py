"""What the roles of the parallel runner share: factories sent to worker
processes as bytes, servers and clients of the roles with the run's
credentials and a bounded connect, the frame limit of a launch. (Metric
names and prefixes are `embodied.run.reporting`'s.)"""

import math
import os

import cloudpickle
import numpy as np
import portal

from embodied import rpc
from embodied.rpc import auth as authlib
from embodied.run.parallel import roles
from embodied.run import replay_size

STOP_KEY = '__stop__'       # in an act reply: the env worker should exit

# The caller of a role's control methods (see `bind_role`).
LAUNCHER = 'launcher'

DEFAULT_MAX_FRAME = 256 << 20  # Where run.max_frame is 0 and not derived.
MIN_MAX_FRAME = 64 << 20


def credentials(args):
    """The run's `rpc.auth.Credentials`, or None with `run.auth False`.
    From `run.secret` (a secret, or the credentials the launcher handed
    its workers), else the EMBODIED_SECRET variable, else the secret file
    in the logdir that every command of the run shares."""
    if not args.get('auth', True):
        return None
    secret = args.get('secret') or os.environ.get(authlib.ENV_VAR)
    if not secret:
        secret = authlib.secret_file(args.logdir)
    return authlib.Credentials.decode(secret)


def handshake(args, control=False):
    """What a client of the run opens its connections with; None (portal's
    plain handshake) with `run.auth False`."""
    creds = credentials(args)
    return creds and creds.handshake(control)


def server(args, role, name, **kwargs):
    """The RPC server of `role` (a name of `roles.TABLE`) at its address,
    with the run's credentials and frame limit."""
    return rpc.Server(
        args[roles.addr_key(role, args)], name, ipv6=ipv6(args),
        auth=credentials(args),
        max_frame=args.get('max_frame') or DEFAULT_MAX_FRAME, **kwargs)


def bind_role(server, role, **given):
    """Binds on `server` every RPC method that `role` declares in its `RPC`
    table ({method: who calls it}): the role's method of the same name, or
    what `given` names for it (a function, or the keyword arguments of
    `server.bind`). Methods the launcher calls are control methods: with
    run.auth, they answer only the launcher's token."""
    for name, caller in role.RPC.items():
        spec = given.get(name) or getattr(role, name)
        kwargs = spec if isinstance(spec, dict) else {'workfn': spec}
        server.bind(name, control=caller == LAUNCHER, **kwargs)


def frame_limit(config, spaces):
    """`run.max_frame` derived from the spaces of one stored step: room for
    four of the largest batches a request carries (a train or report batch
    of the learner, a step of every env), and at least 64 MiB for metrics."""
    step = sum(
        math.prod(space.shape) * np.dtype(space.dtype).itemsize
        for space in spaces.values())
    rows = max(
        config.batch_size * replay_size.shape(config, 'train')[1],
        config.batch_size * replay_size.shape(config, 'eval')[1],
        config.run.envs + config.run.eval_envs)
    return int(max(MIN_MAX_FRAME, 4 * rows * step))


# The roles whose server is reached from elsewhere when a `run.remote_*`
# flag is set: a separately started role's own, and that of the roles at
# the actor's address (the agent's, or the policy process's) when their
# callers, the env workers, are started apart.
REMOTE_FLAGS = {
    **{role.name: role.separate for role in roles.SERVED if role.separate},
    **{role.name: roles.ROLES['envs'].separate for role in roles.SERVED
       if role.addr == 'actor_addr'}}


def is_remote(args, role):
    """Whether `role`'s server runs apart from this launch: flagged so
    (`run.remote_replay`, `run.remote_envs`) or at an address naming a host
    other than this one's loopback."""
    if args.get(REMOTE_FLAGS.get(role, ''), False):
        return True
    host, _ = rpc.addresses.split(args[roles.addr_key(role, args)])
    return host not in ('', 'localhost', 'ip6-localhost', '127.0.0.1', '::1')


def connect_timeout(args, role):
    """Seconds to wait for `role`'s server: run.connect_timeout for a remote
    role; None (no limit) for one this launch started, which may be slow to
    come up on a busy machine or while the agent compiles, and whose death
    the launcher notices on its own."""
    return args.connect_timeout if is_remote(args, role) else None


def connect(args, role, name, separate=False, wait=False, **kwargs):
    """A client of `role`'s server; `Unreachable` (`Refused` when the server
    refused the secret) after run.connect_timeout when the role is remote
    or this is a command started apart from the main run (`separate`),
    with a report every run.wait_report seconds while it waits. With
    `wait`, no limit: a role of the same launch, however long it builds
    (the launcher ends the run if it dies)."""
    timeout = args.connect_timeout if separate else connect_timeout(args, role)
    timeout = None if wait else timeout
    return rpc.connect(
        args[roles.addr_key(role, args)], name, timeout,
        report_every=args.wait_report, handshake=handshake(args),
        **kwargs)


def ipv6(args):
    """Whether servers and clients use IPv6 (`ipv6` or portal's setup)."""
    return bool(args.get('ipv6', portal.context.serverkw.get('ipv6', False)))


def dumps(fn):
    """A factory as bytes, so a worker process can receive it."""
    return fn if isinstance(fn, bytes) else cloudpickle.dumps(fn)


def loads(fn):
    """A factory from `dumps` (or as given when it is no bytes)."""
    return cloudpickle.loads(fn) if isinstance(fn, bytes) else fn
