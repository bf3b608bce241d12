"""The policy role (`run.policy_worker process`): the actor and the policy
in a process of their own, acting with the parameters the agent's learner
publishes through shared memory, so that on a GPU the policy's calls do not
queue behind the train steps on the agent process's one compute stream.

    parallel_policy(make_agent, args):
        agent = make_agent(), built for acting only (the policy programs
                alone), in run.policy_memory of the GPU's memory; of a
                replica: on its host's devices, outside JAX's distributed
                runtime, which its replica's agent joins
        agent's server (run.agent_addr) .policy_buffer() -> the buffer
        Subscriber: each new generation of the parameters to the policy
                devices, installed between policy calls (param_sync.py);
                the first one before the actor serves
        parallel_actor(agent) serves `act` at run.actor_addr (actor.py),
                with `PolicyControl` beside it

The agent process publishes the learner's parameters every
`run.policy_sync_every` updates (`agent.serve_control`). Each policy
call records how many updates old its parameters were; the record flows
back through the buffer to the learner, which logs it as `policy_lag/mean`
and `policy_lag/max` as in the thread mode. The process has nothing of its
own to save: its parameters come from the learner, its envs' recurrent
states start afresh with each launch, as the agent's actor's do.

RPC methods served: `ActorRole.RPC` and `PolicyControl.RPC`. Called: the
agent's `policy_buffer`, replay `add_batch`, logger `tran`.
"""

import threading
import time

import numpy as np

from embodied.run import arguments
from embodied.run.parallel import roles
from embodied.run.parallel import connections
from embodied.run.parallel.actor import ActingControl
from embodied.run.parallel.actor import parallel_actor
from embodied.run.parallel.agent import build
from embodied.run.parallel.link import AgentLink


def parallel_policy(make_agent, args):
    """The actor and the policy, fed the learner's parameters."""
    args = arguments.normalize(args)
    if args.replicas > 1:
        # Its replica's learner joins the replicas' runtime; the policy
        # acts on this host's devices with the parameters it publishes.
        from embodied.jax import distributed
        distributed.stay_local(args.replica, args.replicas)
    agent = build(make_agent, args, 'policy')
    buffer = _buffer(args)
    subscriber = None
    if buffer:
        _new_seeds(agent, buffer['version'])
        subscriber = _subscribe(agent, buffer, args)
        agent = _Lagged(agent, subscriber)
    # Nothing to wait for: the learner restored the parameters before it
    # published them.
    link = AgentLink(barrier=threading.Barrier(1))
    control = PolicyControl(link, subscriber)
    try:
        return parallel_actor(agent, link, args, control, role='policy')
    finally:
        if subscriber:
            subscriber.close()


def _buffer(args):
    """{'path', 'layout'} of the agent's parameter buffer ({} for an agent
    that publishes none); the agent serves it once the learner restored
    the agent."""
    client = connections.connect(args, 'agent', 'PolicyAgent', wait=True)
    try:
        return client.call('policy_buffer').result()
    finally:
        client.close(1)


def _new_seeds(agent, updates):
    """Starts the policy's random stream of this launch at a position of
    its own: its calls count from `updates` (the learner's update count
    when the process started) times 2**32, so a resumed run draws other
    seeds than the launches before it, as the thread mode's agent, which
    continues its saved stream, does. Before the first parameters: a load
    replaces the acting ones. Of a replica, the seeds hold its index
    (`embodied.jax.hosts.seed_entropy`), as its agent's would."""
    agent.load({'rng/policy': np.int64(int(updates) << 32)},
               regex='^rng/policy$')


def _subscribe(agent, buffer, args):
    """A started `param_sync.Subscriber` that installs each generation on
    `agent`, once the first one is installed."""
    from embodied.jax import param_sync
    layout = tuple(
        (str(name), str(dtype), tuple(int(x) for x in shape))
        for name, dtype, shape in buffer['layout'])
    subscriber = param_sync.Subscriber(
        buffer['path'], layout, agent.policy_shardings,
        agent.set_policy_params)
    start = time.monotonic()
    while not subscriber.wait(args.wait_report):
        print(f'Policy: waiting for the learner\'s parameters in '
              f'{buffer["path"]} ({time.monotonic() - start:.0f} s so far).',
              flush=True)
    return subscriber.start()


class _Lagged:
    """The agent as the actor calls it, recording at each policy call how
    many updates old the parameters are (`Subscriber.lag`), as the thread
    mode's agent records them when a call takes its parameters."""

    def __init__(self, agent, subscriber):
        self.agent, self.subscriber = agent, subscriber

    def init_policy(self, batch_size):
        return self.agent.init_policy(batch_size)

    def policy(self, carry, obs, mode='train'):
        self.subscriber.check()  # A failed read ends the actor's server.
        self.subscriber.lag()  # Of the parameters the call starts with.
        return self.agent.policy(carry, obs, mode)


class PolicyControl(ActingControl):
    """The policy process's side of the control protocol (control.py),
    bound on its actor's server at `run.actor_addr`. It saves nothing (its
    parameters come from the learner). Stop stages: 'envs' (every `act`
    from now on gets the stop reply), 'exit' (ends the server and the
    process)."""

    ROLE = 'policy'
    STAGES = roles.stage_names(ROLE)

    def __init__(self, link, subscriber=None):
        super().__init__()
        self.link = link
        self.subscriber = subscriber

    def status(self):
        """The actor's counters and the parameters' (`policy_params_`:
        version acting, reads and seconds spent reading)."""
        status = super().status()
        sub = self.subscriber
        if sub is not None:
            status.update(
                policy_params_version=int(sub.version or 0),
                policy_params_reads=int(sub.reads),
                policy_params_seconds=float(sub.read_seconds))
        return status

    def _stop_exit(self):
        self.link.shutdown.set()

