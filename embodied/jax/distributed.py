"""JAX's multi-controller runtime for runs of several replicas (hosts).

Every replica runs the same command; the process that builds the agent
calls `start(config)` before JAX touches a device. Replica 0 hosts JAX's
coordination service at `jax.coordinator_address`; all replicas join it
(`jax.distributed.initialize`), after which `jax.devices()` lists every
host's devices and jitted computations over a global mesh run as one
program, with gloo collectives on CPU and NCCL on GPU.

The coordination service also holds a key-value store, which this module
uses (and nothing else of ours) to

* refuse a replica whose config differs (`check_same_config`),
* agree on decisions every replica must take alike: the `GlobalClock`s of
  `embodied.core.clock` (log, report, save, stop) through `ClockLink`, and
  the resume tag (`agree_tags`).

A replica that dies stops sending heartbeats; JAX's service notices after
`HEARTBEAT_SECONDS` and ends the others, and a collective with the dead
replica fails at once (`lost_replica_message` names it).
"""

import faulthandler
import json
import os
import sys
import threading
import time

#: Seconds without a heartbeat after which JAX's service takes a replica
#: for lost; the watchdog of every other replica then ends it.
HEARTBEAT_SECONDS = 15
#: Seconds between the watchdog's looks at which replicas are alive.
WATCH_SECONDS = 1.0
#: Seconds a replica waits at the end of the run for the others.
SHUTDOWN_SECONDS = 300
#: Milliseconds a replica waits for another's key-value entry before it
#: says which replica is missing; a dead replica ends the run sooner
#: through the heartbeat.
WAIT_MS = 30 * 60 * 1000

# Keys that may differ between the replicas of one run: where each one is
# and what it prints, never what it computes.
PER_REPLICA_KEYS = (
    'replica', 'logdir', 'errfile', 'run.secret', 'run.actor_addr',
    'run.replay_addr', 'run.logger_addr', 'run.usage', 'logger',
    'jax.policy_devices', 'jax.coordinator_address', 'jax.gloo_address',
    'clock_addr', 'clock_port')
#: The environment variable that, like jax.gloo_address, names the address
#: or network interface this host's gloo collectives advertise.
GLOO_ENV = 'EMBODIED_GLOO_ADDRESS'

_lock = threading.Lock()
_state = {}  # replica, replicas, address once started
_local = {}  # replica, replicas of a process that `stay_local` marked


class ReplicaError(RuntimeError):
    """The replicas of a run cannot work together (a config differs, the
    coordinator cannot be reached, a replica was lost). `together`: every
    replica raises it at the same point, so each can wait for the others
    to report it before replica 0 (the coordinator) leaves."""

    def __init__(self, message, together=False):
        super().__init__(message)
        self.together = together


def started():
    """Whether this process joined a multi-replica run."""
    return bool(_state)


def replica():
    return _state.get('replica', 0)


def replicas():
    return _state.get('replicas', 1)


def stay_local(replica, replicas):
    """Marks this process as one of replica `replica`'s (of `replicas`)
    that builds an agent on its own host's devices alone, outside the
    replicas' runtime: the policy process, fed the parameters by its
    replica's learner. `start` joins nothing here; `acting_replica` still
    names the replica, whose envs the process acts in."""
    if _state:
        raise ReplicaError(
            f'This process joined the run as replica {_state["replica"]}; '
            f'it cannot also act outside the replicas\' runtime.')
    _local.update(replica=int(replica), replicas=int(replicas))


def local():
    """Whether `stay_local` kept this process out of the runtime."""
    return bool(_local)


def acting_replica():
    """The replica whose envs this process acts in, in a run of several
    replicas (joined, or kept local by `stay_local`); None with one."""
    if _state:
        return _state['replica']
    if _local and _local['replicas'] > 1:
        return _local['replica']
    return None


def start(config):
    """Joins the run's replicas when `config.replicas > 1`; does nothing
    otherwise, when already joined or in a process `stay_local` marked.
    `config` holds `replica`, `replicas`,
    `jax` (with `coordinator_address`, `platform`) and optionally
    `run.connect_timeout`, the seconds to wait for the coordinator and the
    other replicas. Must run before JAX first uses a device."""
    count = int(config.get('replicas', 1))
    if count <= 1 or _local:
        return False
    index = int(config.get('replica', 0))
    address = str(config.jax.get('coordinator_address', '') or '')
    run = dict(config.get('run', None) or {})
    timeout = int(run.get('connect_timeout', 120))
    with _lock:
        if _state:
            if (_state['replica'], _state['replicas']) != (index, count):
                raise ReplicaError(
                    f'This process joined the run as replica '
                    f'{_state["replica"]} of {_state["replicas"]}; it cannot '
                    f'also be replica {index} of {count}.')
            return False
        if not address:
            raise ReplicaError(
                f'replicas is {count} but jax.coordinator_address is empty: '
                f'give every replica --jax.coordinator_address HOST:PORT, '
                f'the address where replica 0 serves the coordinator.')
        if not 0 <= index < count:
            raise ReplicaError(
                f'replica is {index}, which is not in [0, {count}) '
                f'(replicas {count}).')
        gloo = _initialize(address, index, count, timeout, config.jax)
        _state.update(replica=index, replicas=count, address=address,
                      gloo=gloo)
        from embodied.core import clock as clocklib
        clocklib.use(ClockLink())
        _state['watchdog'] = Watchdog()
    gloo = _state.get('gloo')
    gloo = f'; gloo at {next(iter(gloo.values()))}' if gloo else ''
    print(f'Replica {index} of {count} joined the run at {address}: '
          f'{_device_summary()}{gloo}.', flush=True)
    return True


def _wait_for_coordinator(address, index, count, timeout):
    """Raises ReplicaError unless a TCP connection to `address` opens
    within `timeout` seconds (JAX's own connect failure ends the process
    without a message of ours)."""
    import socket
    host, _, port = address.rpartition(':')
    host = host.strip('[]') or 'localhost'
    deadline = time.monotonic() + timeout
    error = None
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, int(port)), timeout=2):
                return
        except (OSError, ValueError) as e:
            error = e
            time.sleep(0.5)
    raise ReplicaError(
        f'Replica {index} of {count} could not reach the coordinator at '
        f'{address} within {timeout} s (jax.coordinator_address, '
        f'run.connect_timeout): {type(error).__name__}: {error}. Replica 0 '
        f'serves it; is it running, and does the address name its host?')


def _initialize(address, index, count, timeout, jaxcfg):
    import jax
    if index > 0:
        _wait_for_coordinator(address, index, count, timeout)
    else:
        print(f'Replica 0 serves the coordinator at {address} and waits up '
              f'to {timeout} s (run.connect_timeout) for the other '
              f'{count - 1}.', flush=True)
    platform = str(jaxcfg.get('platform', 'auto'))
    gloo = None
    if platform == 'cpu' or os.environ.get('JAX_PLATFORMS', '') == 'cpu':
        jax.config.update('jax_cpu_collectives_implementation', 'gloo')
        gloo = _advertise_gloo(address, jaxcfg)
    mock = int(jaxcfg.get('mock_devices', 0) or 0)
    if mock:
        jax.config.update('jax_num_cpu_devices', mock)
    # A lost replica must not make JAX abort the others from inside its
    # client (with a message of its own): the watchdog ends them, naming it.
    jax.config.update('jax_enable_recoverability', True)
    # JAX's preemption notifier (on by default) installs a C-level SIGTERM
    # handler in `initialize` that takes the signal from Python's: the
    # launcher's StopSignal would never run, and a SIGTERM from Slurm,
    # Kubernetes or a user would not stop the run with a final save. The
    # stop is agreed through the replicas' stop clock instead.
    jax.config.update('jax_enable_preemption_service', False)
    try:
        jax.distributed.initialize(
            address, num_processes=count, process_id=index,
            initialization_timeout=max(1, int(timeout)),
            heartbeat_timeout_seconds=HEARTBEAT_SECONDS,
            shutdown_timeout_seconds=SHUTDOWN_SECONDS)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ''
        who = 'serve' if index == 0 else 'reach'
        raise ReplicaError(
            f'Replica {index} of {count} could not {who} the coordinator at '
            f'{address} within {timeout} s (jax.coordinator_address, '
            f'run.connect_timeout), or not every replica joined: '
            f'{type(e).__name__}: {first}') from None
    return gloo


def gloo_endpoint(address, choice=''):
    """The keyword gloo gets for where this host listens and what it
    tells the other replicas: `interface` when `choice` names a network
    interface here, else `hostname`: `choice`, or the local address from
    which this host reaches the coordinator at `address`."""
    import socket
    choice = str(choice or '').strip()
    if choice and choice in {name for _, name in socket.if_nameindex()}:
        return {'interface': choice}
    if choice:
        return {'hostname': choice}
    from embodied.rpc import addresses
    try:
        return {'hostname': addresses.local_address_toward(address)}
    except (OSError, ValueError) as e:
        raise ReplicaError(
            f'No route from this host to the coordinator at {address} '
            f'(jax.coordinator_address): {e}. Set jax.gloo_address (or '
            f'{GLOO_ENV}) to the address or interface the other replicas '
            f'reach this host at.') from None


def _advertise_gloo(address, jaxcfg):
    """Has the CPU backend's gloo collectives listen on and advertise
    `gloo_endpoint` (jax.gloo_address, else EMBODIED_GLOO_ADDRESS, else the
    route to the coordinator) instead of what this machine's hostname
    resolves to, which is often a loopback address (127.0.1.1 on Debian)
    that other hosts cannot reach. Returns the endpoint."""
    from jax._src import distributed as jax_distributed
    from jax._src import xla_bridge
    from jax._src.lib import _jax
    endpoint = gloo_endpoint(
        address, jaxcfg.get('gloo_address', '') or os.environ.get(GLOO_ENV))

    def make_cpu_client():
        client = jax_distributed.global_state.client
        collectives = client and _jax.make_gloo_tcp_collectives(
            distributed_client=client, **endpoint)
        return xla_bridge.make_cpu_client(collectives=collectives or None)
    # JAX's own CPU factory, with gloo's address given (before any backend
    # exists, which `start`'s callers ensure).
    xla_bridge.register_backend_factory(
        'cpu', make_cpu_client, priority=0, fail_quietly=False)
    return endpoint


def _device_summary():
    import jax
    return (f'{jax.local_device_count()} local and {jax.device_count()} '
            f'global {jax.devices()[0].platform} devices')


def _client():
    from jax._src import distributed
    client = distributed.global_state.client
    if client is None:
        raise ReplicaError('JAX distributed runtime is not started.')
    return client


def _get(key, who, what):
    try:
        return _client().blocking_key_value_get(key, WAIT_MS)
    except Exception as e:
        raise ReplicaError(
            f'Replica {who} did not provide {what} within '
            f'{WAIT_MS // 1000} s: {type(e).__name__}: '
            f'{str(e).strip()[:200]}') from None


def check_same_config(config, name='config'):
    """Raises ReplicaError on every replica whose `config` (a flat mapping or
    an `elements.Config`) differs from replica 0's in a key that is not in
    `PER_REPLICA_KEYS`, naming the first such key and both values."""
    if not started():
        return
    flat = dict(config.flat) if hasattr(config, 'flat') else dict(config)
    shared = {
        k: v for k, v in flat.items() if not any(
            k == p or k.startswith(p + '.') for p in PER_REPLICA_KEYS)}
    mine = json.dumps(shared, sort_keys=True, default=str)
    me = replica()
    _client().key_value_set(f'embodied/{name}/{me}', mine)
    barrier(f'{name}-published')
    problem = None
    for other in (range(1, replicas()) if me == 0 else [0]):
        theirs = json.loads(_get(
            f'embodied/{name}/{other}', other, f'its {name}'))
        problem = problem or _difference(json.loads(mine), theirs, me, other)
    # Every replica has compared before any leaves (replica 0's leaving
    # ends the coordinator).
    barrier(f'{name}-checked')
    if problem:
        raise ReplicaError(problem, together=True)


def _difference(ours, theirs, me, other):
    """The first key whose values differ, as a message; None if none."""
    low, high = min(me, other), max(me, other)
    for key in sorted(set(ours) | set(theirs)):
        a, b = ours.get(key, '<missing>'), theirs.get(key, '<missing>')
        if a != b:
            values = {me: a, other: b}
            return (
                f'Replicas {low} and {high} have different configs: {key} '
                f'is {values[low]!r} on replica {low} and {values[high]!r} '
                f'on replica {high}. Every replica must run the same command '
                f'(only where it runs and what it prints may differ: '
                f'{", ".join(PER_REPLICA_KEYS)}).')
    return None


def barrier(name, timeout_ms=WAIT_MS):
    """Waits until every replica reached `name` (no-op with one replica)."""
    if not started():
        return
    _client().wait_at_barrier(f'embodied/{name}', timeout_ms)


def agree_tags(tags):
    """The newest of `tags` (this replica's complete checkpoint tags) that
    every replica holds, or None; the same answer on every replica. Every
    replica must call it equally often. Without joined replicas, the newest
    of `tags`."""
    if not started():
        return max(tags) if tags else None
    with _lock:
        name = _state['agreements'] = _state.get('agreements', 0) + 1
    me, client = replica(), _client()
    client.key_value_set(
        f'embodied/tags/{name}/{me}', json.dumps(sorted(int(t) for t in tags)))
    common = None
    for other in range(replicas()):
        theirs = set(json.loads(_get(
            f'embodied/tags/{name}/{other}', other, 'its checkpoint tags')))
        common = theirs if common is None else common & theirs
    return max(common) if common else None


def exchange(name, value):
    """Every replica's `value` (JSON), as a list indexed by replica; the
    same list on every replica. Every replica must call it with `name`
    equally often (at points they reach in lockstep, such as a
    `GlobalClock`'s decision). Without joined replicas, `[value]`."""
    if not started():
        return [value]
    with _lock:
        rounds = _state.setdefault('exchanges', {})
        n = rounds[name] = rounds.get(name, 0) + 1
    me, client = replica(), _client()
    prefix = f'embodied/exchange/{name}'
    client.key_value_set(f'{prefix}/{n}/{me}', json.dumps(value))
    values = [json.loads(_get(f'{prefix}/{n}/{other}', other, name))
              for other in range(replicas())]
    if n >= 3 and me == 0:  # Every replica has read round n - 2 by now.
        try:
            client.key_value_delete(f'{prefix}/{n - 2}/')
        except Exception:
            pass
    return values


def check_shared_logdir(logdir):
    """Raises ReplicaError when the replicas do not see one logdir: replica
    0 writes a file with a nonce there and every replica must read it."""
    if not started():
        return
    import secrets
    path = os.path.join(str(logdir), 'replicas.check')
    if replica() == 0:
        nonce = secrets.token_hex(8)
        os.makedirs(str(logdir), exist_ok=True)
        with open(path + '.tmp', 'w') as f:
            f.write(nonce)
        os.replace(path + '.tmp', path)
        _client().key_value_set('embodied/logdir-nonce', nonce)
    nonce = _get('embodied/logdir-nonce', 0, 'the logdir check')
    seen = ''
    for _ in range(50):  # Network file systems may show it a little later.
        try:
            with open(path) as f:
                seen = f.read().strip()
        except OSError:
            seen = ''
        if seen == nonce:
            break
        time.sleep(0.1)
    if seen != nonce:
        raise ReplicaError(
            f'Replica {replica()} does not see the logdir of replica 0 at '
            f'{logdir} (the file {path} it wrote is missing or older here). '
            f'A run of several replicas needs one logdir every host shares '
            f'(a network file system or a bucket path): the parameters are '
            f'written once and loaded by all.')
    barrier('logdir-checked')


class ClockLink:
    """The decisions of `embodied.GlobalClock`s through JAX's key-value
    store: in round n of a clock each replica posts whether it skips,
    replica 0 decides with its own clock and posts the decision, the others
    read it. Installed by `embodied.clock.use` when a replica joins."""

    def __init__(self):
        self.replica, self.replicas = replica(), replicas()
        self.client = _client()
        self.lock = threading.Lock()
        self.created = 0
        self.calls = {}
        self.clocks = {}

    def create(self, every, first):
        from embodied.core import clock as clocklib
        with self.lock:
            clockid = self.created
            self.created += 1
            self.calls[clockid] = 0
        if self.replica == 0:
            self.clocks[clockid] = clocklib.LocalClock(every, first)
        return clockid

    def should(self, clockid, skip):
        with self.lock:
            n = self.calls[clockid]
            self.calls[clockid] = n + 1
        prefix = f'embodied/clock/{clockid}'
        self.client.key_value_set(f'{prefix}/{n}/skip/{self.replica}',
                                  '1' if skip else '0')
        key = f'{prefix}/{n}/decision'
        if self.replica != 0:
            return _get(key, 0, f'clock {clockid} decision {n}') == '1'
        skipped = bool(skip)
        for other in range(1, self.replicas):
            value = _get(f'{prefix}/{n}/skip/{other}', other,
                         f'call {n} of clock {clockid}')
            skipped = skipped or value == '1'
        decision = self.clocks[clockid](skip=skipped)
        self.client.key_value_set(key, '1' if decision else '0')
        if n >= 2:  # Every replica has read round n - 2 by now.
            try:
                self.client.key_value_delete(f'{prefix}/{n - 2}/')
            except Exception:
                pass
        return decision


class Watchdog:
    """A thread that ends this replica when another one is lost: it asks
    the coordinator which replicas still send heartbeats every
    `WATCH_SECONDS`; one missing (after `HEARTBEAT_SECONDS` without
    heartbeats), or the coordinator itself unreachable, ends this process
    with a message naming it and exit code 1. A replica blocked in a
    collective or a key-value wait for the lost one never waits longer."""

    def __init__(self):
        self.ending = threading.Event()
        self.thread = threading.Thread(
            target=self._watch, name='ReplicaWatchdog', daemon=True)
        self.thread.start()

    def _watch(self):
        everyone = list(range(replicas()))
        errors = 0
        while not self.ending.wait(WATCH_SECONDS):
            try:
                live = _client().get_live_nodes(everyone)
                errors = 0
            except Exception as e:
                errors += 1
                if errors >= 3 and not self.ending.is_set():
                    _die(f'Replica {replica()} lost contact with the '
                         f'coordinator (replica 0 at {_state["address"]}): '
                         f'{type(e).__name__}: {str(e).strip()[:160]}')
                continue
            lost = sorted(set(everyone) - {int(k) for k in live})
            if lost and not self.ending.is_set():
                _die(f'Replica {replica()}: replica '
                     f'{", ".join(map(str, lost))} of {replicas()} was lost '
                     f'(no heartbeat for {HEARTBEAT_SECONDS} s); ending this '
                     f'replica too. Start every replica again to resume '
                     f'from the last save all of them hold.')


def _die(message):
    """Ends this replica at once with `message`, after the stack of every
    thread: a replica that another one's watchdog found silent is
    explained by where its threads were."""
    print(message, file=sys.stderr, flush=True)
    try:
        fileno = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        fileno = None  # A stderr without a file (replaced in-process).
    if fileno is not None:
        print(f'Replica {replica()} ends; its threads were at:',
              file=sys.stderr, flush=True)
        faulthandler.dump_traceback(fileno, all_threads=True)
    sys.stdout.flush()
    os._exit(1)


def finish(timeout=600):
    """At the end of a run: waits until every replica got here, so that no
    replica leaves while another still needs the coordinator; the watchdog
    stops watching first."""
    if not started() or _state.get('finished'):
        return
    _state['finished'] = True
    _state['watchdog'].ending.set()
    client = _client()
    try:
        client.wait_at_barrier('embodied/finish', int(timeout * 1000))
    except Exception as e:
        _die(f'Replica {replica()}: not every replica reached the end of '
             f'the run within {timeout} s: {type(e).__name__}: '
             f'{str(e).strip()[:160]}')
    # Replica 0's process serves the coordinator, so it leaves last: the
    # others disconnect now, and it waits until they have.
    import jax
    if replica() != 0:
        jax.distributed.shutdown()
        return
    deadline = time.monotonic() + 60
    others = list(range(replicas()))
    while time.monotonic() < deadline:
        try:
            if set(int(k) for k in client.get_live_nodes(others)) <= {0}:
                break
        except Exception:
            break
        time.sleep(0.2)
    jax.distributed.shutdown()


def lost_replica_message(error):
    """A line naming the replicas the coordination service no longer hears
    from, for an error a collective raised; None when `error` is not a lost
    replica (or the run has one replica). A `ReplicaError` that every
    replica raised together is none, whatever words it holds: its message
    names keys such as `jax.gloo_address`."""
    if not started() or getattr(error, 'together', False):
        return None
    text = str(error)
    markers = ('Gloo', 'gloo', 'heartbeat', 'Connection closed', 'NCCL',
               'coordination', 'UNAVAILABLE', 'Barrier')
    if not any(m in text for m in markers):
        return None
    lost = []
    try:
        live = _client().get_live_nodes(list(range(replicas())))
        lost = sorted(set(range(replicas())) - set(int(k) for k in live))
    except Exception:
        lost = []
    if not lost and replicas() == 2:
        # The heartbeat has not shown it yet; with two, it is the other.
        lost = [1 - replica()]
    who = (f'replica {", ".join(map(str, lost))}' if lost else
           'another replica')
    return (f'Replica {replica()} lost contact with {who} of '
            f'{replicas()} in a collective ({str(error).strip()[:160]}); '
            f'ending this replica. Start every replica again to resume from '
            f'the last common save.')


def exit_lost(error):
    """Prints `lost_replica_message(error)` and ends the process with exit
    code 1 at once, without the shutdown barrier the lost replica would
    never reach. Returns when `error` is no lost replica."""
    message = lost_replica_message(error)
    if message is None:
        return
    _die(message)
