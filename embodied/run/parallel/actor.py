"""The actor thread of the agent process: serves `act` to the env workers.

    act(obs rows of several envs) -> actions      (batched, see below)
        workfn: stack the carries of the envs, agent.policy(carry, obs),
                keep each env's new carry, reply with the actions
        postfn: replay.add_batch(transitions),
                logger.tran(the env's side of them: obs, log/ keys)

The server batches `run.actor_batch` envs per policy call (a partial batch
runs after `run.actor_flush` seconds) and answers each env worker before the
transitions are sent on. `log/` keys of an observation go to the logger only.

RPC methods served: `act`, and for the launcher `status`, `pause`, `resume`,
`drained`, `save`, `stop_learner`, `stop_envs`, `shutdown`.
RPC methods called: replay `add_batch`, logger `tran`.
"""

import collections
import threading
import time

import elements
import numpy as np

from embodied import rpc
from embodied.run import arguments
from embodied.run import wiring
from embodied.run.parallel.link import link_of
from embodied.run.wiring import prefix


@elements.timer.section('actor')
def parallel_actor(agent, barrier, args):
    """Serves `act`: batches envs, runs the policy, replies, then sends the
    transitions to the replay and logger."""
    args = arguments.normalize(args)
    link = link_of(barrier)
    islist = lambda x: isinstance(x, list)
    initial = agent.init_policy(args.actor_batch)
    initial = elements.tree.map(lambda x: x[0], initial, isleaf=islist)
    carries = collections.defaultdict(lambda: initial)
    barrier.wait()  # Do not collect data before the learner restored.

    backlog = 8 * args.actor_threads
    replay = wiring.connect(args, 'replay', 'ActorReplay', maxinflight=backlog)
    logger = wiring.connect(args, 'logger', 'ActorLogger', maxinflight=backlog)
    inflight = collections.deque()  # Futures of sent transitions.
    inflight_lock = threading.Lock()
    counts = collections.Counter()
    counts_lock = threading.Lock()  # workfn runs on run.actor_threads threads.
    done = threading.Event()

    def settle():
        """Forgets sent transitions that arrived; True when none is left."""
        with inflight_lock:
            while inflight and inflight[0].done():
                inflight.popleft().result()  # Raises what the role raised.
            return not inflight

    @elements.timer.section('workfn')
    def workfn(obs):
        start = time.monotonic()
        envid = obs.pop('envid')
        is_eval = obs.pop('is_eval')
        carry = [carries[e] for e in envid.tolist()]
        carry = elements.tree.map(lambda *xs: list(xs), *carry)
        logs = {k: v for k, v in obs.items() if k.startswith('log/')}
        obs = {k: v for k, v in obs.items() if not k.startswith('log/')}
        carry, acts, outs = agent.policy(carry, obs)
        clash = set(acts) & set(outs)
        assert not clash, f'policy outs repeat action keys: {sorted(clash)}'
        for i, e in enumerate(envid.tolist()):
            carries[e] = elements.tree.map(lambda x: x[i], carry, isleaf=islist)
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
        with counts_lock:
            counts['policy_steps'] += len(envid)
            counts['policy_seconds'] += time.monotonic() - start
        return reply, (data, episode)

    def wait_for_room():
        """Back-pressure: waits while `backlog` sends are in flight, as the
        clients' maxinflight would, but gives up at shutdown (a client call
        blocked on a dead role would keep the process from exiting)."""
        while True:
            with inflight_lock:
                oldest = inflight[0] if len(inflight) >= backlog else None
            if oldest is None:
                return
            if done.is_set():
                raise RuntimeError('The actor shut down with transitions '
                                   'still waiting for the replay or logger.')
            oldest.wait(0.1)
            settle()

    @elements.timer.section('postfn')
    def postfn(trans):
        data, episode = trans
        wait_for_room()
        futures = (replay.add_batch(data), logger.tran(episode))
        with inflight_lock:
            inflight.extend(futures)
        settle()

    def drained():
        return server.idle('act') and settle()

    def status():
        server_stats = server.stats()
        with counts_lock:
            totals = dict(counts)
        return {
            **{k: int(v) if isinstance(v, int) else float(v)
               for k, v in totals.items()},
            **{f'learner_{k}': v for k, v in dict(link.learner).items()},
            **prefix(server_stats, 'server'),
            'carries': len(carries),
        }

    def save(tag):
        with link.train_lock:
            link.checkpoint.save(int(tag))
        return int(tag)

    def stop_learner():
        link.learner_stop.set()
        link.learner_done.wait(args.connect_timeout)
        return link.learner_done.is_set()

    server = rpc.Server(
        args.actor_addr, 'Actor', flush_after=args.actor_flush,
        ipv6=wiring.ipv6(args))
    server.bind(
        'act', workfn, postfn, batch=args.actor_batch,
        workers=args.actor_threads)
    server.bind('status', status)
    server.bind('pause', lambda: server.pause('act'))
    server.bind('resume', lambda: server.resume('act'))
    server.bind('drained', drained)
    server.bind('save', save)
    server.bind('stop_learner', stop_learner)
    server.bind('stop_envs', lambda: server.answer(
        'act', {wiring.STOP_KEY: True}))
    server.bind('shutdown', done.set)
    server.start()
    try:
        while not done.wait(0.2):
            server.raise_error()
        _wait_envs_gone(server)
    finally:
        server.close()
        replay.close(1)
        logger.close(1)
    return 0


def _wait_envs_gone(server, timeout=5):
    """Gives env workers time to receive their stop reply and hang up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(server.connections) <= 1:  # The launcher's control client.
            return
        time.sleep(0.05)

