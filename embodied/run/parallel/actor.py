"""The actor thread: serves `act` to the env workers. With
`run.policy_worker thread` (the default on CPU) it is a thread of the agent
role, which is a thread of the launcher's process (a process of its own
with `run.agent_process True`); with `run.policy_worker process` (the
default on a GPU) it is a thread of the policy process (policy.py).

    act(obs rows of several envs) -> actions      (batched, see below)
        ActorRole.act (workfn): stack the carries of the envs,
                agent.policy(carry, obs), keep each env's new carry, reply
                with the actions
        ActorRole.send (postfn): replay.add_batch(transitions),
                logger.tran(the env's side of them: obs, log/ keys)

The server batches `run.actor_batch` envs per policy call (a partial batch
runs after `run.actor_flush` seconds) and answers each env worker before the
transitions are sent on. While the replay works on the last send (its
limiter holds inserts back), further transitions are held and go on joined
(`rpc.actor_to_replay.CoalescingSender`): a busy replay gets fewer, larger
requests.

The server on `run.actor_addr` is the one server of the process the actor
runs in: the actor binds `act` on it, next to that role's control methods
(`AgentControl` in agent.py in thread mode, `PolicyControl` in policy.py in
process mode, handed to `parallel_actor` as `control`; the agent's control
then serves at `run.agent_addr`).

RPC methods served: `ActorRole.RPC`. Called: replay `add_batch`, logger
`tran`.
"""

import collections
import threading
import time

import elements
import numpy as np

from embodied import rpc
from embodied.core import checks
from embodied.run import arguments
from embodied.run.parallel import connections
from embodied.run.parallel import control
from embodied.run.parallel.link import link_of
from embodied.run.reporting import prefix


class ActorRole:
    """The actor's logic; its RPC method is `act`, whose reply goes back
    before `send` (its postfn) passes the transitions on. `replay` and
    `logger` are clients. `act` runs on `run.actor_threads` threads at once;
    `send` one call at a time, in request order. Keeps one policy carry per
    env. `flush()` sends held transitions; the actor's loop calls it every
    few milliseconds and the agent's `quiesce` before a save."""

    RPC = {'act': 'env workers'}  # Its RPC method: who calls it.

    def __init__(self, agent, args, replay, logger, closing=None,
                 hold_rows=None):
        self.agent = agent
        self.replay, self.logger = replay, logger
        self.backlog = backlog(args)
        # Transitions held while the replay works on the last send: up to 8
        # policy batches (fewer cost more CPU per env step; figures in
        # docs/benchmarks.md, "Figures behind settings in the code").
        self.sender = rpc.actor_to_replay.CoalescingSender(
            self._send, rpc.actor_to_replay.concat_rows,
            lambda trans: len(trans[0]['envid']),
            hold_rows or 8 * max(1, args.actor_batch), self.backlog,
            closing, name='The actor')
        self.closing = self.sender.closing  # Set at shutdown.
        self.inflight = self.sender.inflight  # Futures of sent transitions.
        islist = lambda x: isinstance(x, list)
        self._islist = islist
        # Each env's carry as the tuple of its leaves, all of one structure
        # (`_structure`): a batch is gathered and scattered leaf by leaf, not
        # with a tree walk per env. An env is in at most one batch at a time.
        leaves, self._structure = elements.tree.flatten(
            agent.init_policy(args.actor_batch), isleaf=islist)
        initial = tuple(leaf[0] for leaf in leaves)
        self.carries = collections.defaultdict(lambda: initial)
        self.counts = collections.Counter()
        self.counts_lock = threading.Lock()  # Guards `counts`.

    @elements.timer.section('workfn')
    def act(self, obs):
        """Runs the policy on the rows of several envs; returns the reply
        (actions and `reset`) and the transitions for `send`."""
        start = time.monotonic()
        envid = obs.pop('envid')
        is_eval = obs.pop('is_eval')
        envids = envid.tolist()
        rows = [self.carries[e] for e in envids]
        carry = elements.tree.unflatten(
            [list(leaf) for leaf in zip(*rows)] if rows[0] else [],
            self._structure)
        logs = {k: v for k, v in obs.items() if k.startswith('log/')}
        obs = {k: v for k, v in obs.items() if not k.startswith('log/')}
        carry, acts, outs = self.agent.policy(carry, obs)
        clash = set(acts) & set(outs)
        assert not clash, f'policy outs repeat action keys: {sorted(clash)}'
        leaves, self._structure = elements.tree.flatten(
            carry, isleaf=self._islist)
        for i, e in enumerate(envids):
            self.carries[e] = tuple(leaf[i] for leaf in leaves)
        acts = {k: np.asarray(v) for k, v in acts.items()}
        outs = {k: np.asarray(v) for k, v in outs.items()}
        ids = {'envid': envid, 'is_eval': is_eval}
        data = {**ids, **obs, **acts, **outs}  # For the replay.
        for value in (*data.values(), *logs.values()):
            if value.flags.writeable and value.flags.owndata:
                value.setflags(write=False)
        # The logger reads only the env's side of a step (episode stats,
        # `log/` metrics, videos), not the policy's outputs.
        episode = {**ids, **obs, **logs}
        reply = {**acts, 'reset': np.asarray(obs['is_last'], bool)}
        with self.counts_lock:
            self.counts['policy_steps'] += len(envid)
            self.counts['policy_seconds'] += time.monotonic() - start
        return reply, (data, episode)

    @elements.timer.section('postfn')
    def send(self, trans):
        """Sends the transitions of one `act` to the replay and logger, or
        holds them while the replay has not answered the last send."""
        self.sender.put(trans)

    def flush(self, force=True):
        """Sends held transitions; see `CoalescingSender.flush`."""
        return self.sender.flush(force)

    def settle(self):
        """Forgets sent transitions that arrived; True when none is left."""
        return self.sender.settle()

    def _send(self, trans):
        data, episode = trans
        return self.replay.add_batch(data), self.logger.tran(episode)

    def carry(self, envid):
        """The policy carry of env `envid` (its initial one before its first
        step)."""
        return elements.tree.unflatten(self.carries[envid], self._structure)

    def stats(self):
        """The policy's step and time counters and the number of carries."""
        with self.counts_lock:
            totals = dict(self.counts)
        return {
            **{k: int(v) if isinstance(v, int) else float(v)
               for k, v in totals.items()},
            'carries': len(self.carries),
        }


def backlog(args):
    """How many sends to the replay and logger may be in flight."""
    return 8 * args.actor_threads


class ActingControl(control.RoleControl):
    """The control protocol's part of a role whose server serves `act`
    (`ActorRole`): the agent's (`AgentControl`) or the policy process's
    (`PolicyControl`). `attach` binds its methods on the server beside
    `act`; without an actor attached (the agent's control while the policy
    runs in a process of its own) the act methods do nothing."""

    def __init__(self):
        self.server = None
        self.actor = None

    def attach(self, server, actor=None):
        """Binds the methods on `server`, whose `act` `actor` serves."""
        self.server, self.actor = server, actor
        connections.bind_role(server, self)

    def status(self):
        """The actor's counters, the server's (`server/`) and the
        addresses of the last peers it refused (`refused_from`)."""
        return {
            **(self.actor.stats() if self.actor else {}),
            **prefix(self.server.stats(), 'server'),
            'refused_from': list(self.server.socket.refused_from),
        }

    def quiesce(self):
        """Holds new `act` batches back; True once every transition the
        actor produced has arrived at the replay and the logger."""
        if self.actor is None:
            return True
        self.server.pause('act')
        return bool(self.server.idle('act') and self.actor.flush() and
                    self.actor.settle())

    def resume(self):
        if self.actor is not None:
            self.server.resume('act')

    def _stop_envs(self):
        """Every `act` from now on gets the stop reply."""
        if self.actor is not None:
            self.server.answer('act', {connections.STOP_KEY: True})


# The server: `act` on run.actor_addr, next to the control methods of the
# role the actor runs in (the agent's, or the policy process's).

@elements.timer.section('actor')
def parallel_actor(agent, barrier, args, control=None, role='agent'):
    """Serves `act` at the address of `role`: batches envs, runs the
    policy, replies, then sends the transitions to the replay and logger.
    `control` (the role's `ActingControl`) is bound on the same server;
    the original's callers pass a plain barrier and no control."""
    args = arguments.normalize(args)
    link = link_of(barrier)
    try:
        link.barrier.wait()  # No data before the learner restored.
    except threading.BrokenBarrierError:
        return 0  # The learner failed; the agent reports its error.
    replay = connections.connect(
        args, 'replay', 'ActorReplay', maxinflight=backlog(args))
    logger = connections.connect(
        args, 'logger', 'ActorLogger', maxinflight=backlog(args))
    try:
        actor = ActorRole(agent, args, replay, logger, link.shutdown)
        server = connections.server(
            args, role, 'Actor', flush_after=args.actor_flush)
        try:
            connections.bind_role(server, actor, act=dict(
                workfn=actor.act, postfn=actor.send, batch=args.actor_batch,
                workers=args.actor_threads, check=_finite_obs))
            if control is not None:
                control.attach(server, actor)
            server.start()
            while not link.shutdown.wait(0.01):
                server.raise_error()
                actor.flush(force=False)
            _wait_envs_gone(server)
        finally:
            link.shutdown.set()
            server.close()
    finally:
        replay.close(1)
        logger.close(1)
    return 0


def _finite_obs(obs):
    """Refuses NaN and infinite observations, which envs that skip the
    space checks (the original's env processes) could otherwise store."""
    envid = obs.get('envid')
    return checks.nonfinite(obs, None if envid is None else envid.tolist())


def _wait_envs_gone(server, timeout=5):
    """Gives env workers time to receive their stop reply and hang up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(server.connections) <= 1:  # The launcher's control client.
            return
        time.sleep(0.05)

