"""The agent role: one agent shared by the actor and learner threads, and
the role's control plane for the launcher. By default the role is a thread
of the launcher's process; with `run.agent_process True` it is a process
of its own. "The agent process" below means whichever process holds it.

    parallel_agent(make_agent, args):
        agent = make_agent(); link = AgentLink()
        control = AgentControl(link, args)
        start Thread(parallel_actor, agent, link, control)  # serves 'act'
                                          # and the control: see actor.py
        start Thread(parallel_learner, agent, link)  # trains: see learner.py
        wait; a failed thread ends the process with its exit code

With `run.policy_worker process` the actor and the policy run in the
policy process instead (policy.py), and the agent is built for
learning only (no policy compiled); the actor thread's place is taken by
`serve_control`, which publishes the policy's parameters to a shared-memory
buffer (`embodied.jax.param_sync.Publisher`, every `run.policy_sync_every`
updates) and serves the control at `run.agent_addr`.

`AgentControl` is the agent's side of the control protocol
(control.py): status, quiesce, save, resume, stop. Its methods are served
on the actor's server at `run.actor_addr`, the one address the launcher,
the env workers and the original's env processes all know (each bound
method has its own threads, so a control call never waits behind `act`):
the actor thread, handed the control as an argument, binds it there beside
`act` before it starts the server.
`AgentLink` (link.py) is what the threads share, each field with its lock.
"""

import os
import threading
import time

from embodied import rpc
from embodied.run import arguments
from embodied.run.parallel import roles
from embodied.run.parallel import connections
from embodied.run.parallel.actor import ActingControl
from embodied.run.parallel.actor import parallel_actor
from embodied.run.parallel.learner import parallel_learner
from embodied.run.parallel.link import AgentLink


# Thread ends that need no traceback: the launcher retries with other ports,
# or the thread's client printed why a peer never came or refused it.
_QUIET_ENDS = (rpc.supervisor.EXIT_PORT_TAKEN,
               rpc.supervisor.EXIT_UNREACHABLE, rpc.supervisor.EXIT_REFUSED)

# JAX's share of GPU memory for a process (read when its backend starts),
# and the variable that marks a share `build` set (not the user): a process
# started later from this one inherits both and sets its own share.
MEMORY_VARIABLE = 'XLA_PYTHON_CLIENT_MEM_FRACTION'
MEMORY_MARK = 'EMBODIED_MEMORY_SHARE'


def parallel_agent(make_agent, args):
    """One agent shared by the actor and learner threads."""
    args = arguments.normalize(args)
    apart = args.policy_worker == 'process'
    agent = build(make_agent, args, 'learner' if apart else None)
    link = AgentLink()
    control = AgentControl(link, args)
    actor = rpc.Thread(
        serve_control if apart else parallel_actor, agent, link, args,
        control, name='Control' if apart else 'Actor')
    learner = rpc.Thread(parallel_learner, agent, link, args, name='Learner')
    actor.start()
    learner.start()
    while actor.exitcode is None or learner.exitcode is None:
        for thread in (actor, learner):
            if thread.exitcode not in (None, 0):
                link.abort()
                if isinstance(thread.exception, rpc.Unreachable):
                    # The agent ends with it: it names the peer that was
                    # not there, for the launcher's one line.
                    raise thread.exception
                if thread.exitcode in _QUIET_ENDS:
                    return thread.exitcode
                raise _ThreadFailed(
                    f'The {thread.name.lower()} thread failed: '
                    f'{thread.error or f"exit code {thread.exitcode}"}',
                    thread.exitcode)
        if learner.exitcode == 0 and not link.learner_stop.is_set():
            return 1  # The learner must only end when asked to.
        time.sleep(0.05)
    # A run shorter than the agent's background compile ends here first.
    getattr(agent, 'finish_compiling', lambda: None)()
    if args.replicas > 1:
        from embodied.jax import distributed
        distributed.finish()  # No replica leaves before the others.
    return 0


def build(make_agent, args, part=None):
    """The agent of `make_agent`, compiling ahead only `part` ('policy',
    'learner'; None: all) of its programs; with `run.policy_worker
    process`, in this process's share of GPU memory (`run.policy_memory`
    or `run.agent_memory`, unless $XLA_PYTHON_CLIENT_MEM_FRACTION is set).
    """
    make_agent = connections.loads(make_agent)
    if part is None:
        return make_agent()
    share = args.policy_memory if part == 'policy' else args.agent_memory
    if MEMORY_VARIABLE not in os.environ or MEMORY_MARK in os.environ:
        os.environ[MEMORY_VARIABLE] = os.environ[MEMORY_MARK] = str(share)
    from embodied.jax import compiling
    with compiling.building(part):
        return make_agent()


def serve_control(agent, link, args, control):
    """With the policy in a process of its own: once the learner restored
    the agent, publishes the policy's parameters to a shared-memory buffer
    and serves the agent's control (and the buffer's place, for the policy
    process) at `run.agent_addr` until the stop."""
    try:
        link.barrier.wait()  # The restored parameters are the first ones.
    except threading.BrokenBarrierError:
        return 0  # The learner failed; the agent reports its error.
    publisher = None
    if hasattr(agent, 'policy_params'):
        from embodied.jax import param_sync
        publisher = param_sync.Publisher(
            agent.policy_params, lambda: agent.updates,
            every=args.policy_sync_every)
    link.publisher = publisher
    server = connections.server(args, 'agent', 'AgentControl')
    try:
        control.attach(server)
        server.start()
        while not link.shutdown.wait(0.05):
            server.raise_error()
            if publisher:
                publisher.check()
    finally:
        link.shutdown.set()
        server.close()
        if publisher:
            publisher.close()
    return 0


class AgentControl(ActingControl):
    """The agent's side of the control protocol (control.py), bound by
    `attach` on the actor's server (with the policy process: on the
    agent's own server, without an actor). The methods run on the server's
    threads and touch the actor and learner only through `link` (under the
    locks it names) and the `act` method's queue. Stop stages: 'learner'
    (True once the learner ended), 'envs' (every `act` from now on gets the
    stop reply), 'exit' (ends the actor's server and thread).
    `policy_buffer` tells the policy process where the parameters are."""

    ROLE = 'agent'
    STAGES = roles.stage_names(ROLE)
    RPC = {**ActingControl.RPC, 'policy_buffer': 'policy process'}

    def __init__(self, link, args):
        super().__init__()
        self.link = link
        self.stop_timeout = args.connect_timeout

    def status(self):
        """The actor's counters, the learner's (`learner_` prefixed), the
        server's (`server/`) and the addresses of the last peers it refused
        (`refused_from`)."""
        return {
            **super().status(),
            **{f'learner_{k}': v for k, v in self.link.learner_stats().items()},
        }

    def save(self, tag):
        """Saves the agent under `tag`, between train steps."""
        with self.link.train_lock:
            self.link.checkpoint.save(int(tag))
        return int(tag)

    def policy_buffer(self):
        """{'path', 'layout'} of the shared-memory buffer the policy
        process reads the parameters from, and the `version` (update count)
        last written there; {} for an agent without parameters to publish
        (it acts with its own)."""
        publisher = self.link.publisher
        if publisher is None:
            return {}
        return {'path': publisher.path,
                'layout': [list(entry) for entry in publisher.layout],
                'version': int(publisher.version)}

    def _stop_learner(self):
        """Stops the learner after its current step; True once it ended."""
        self.link.learner_stop.set()
        self.link.learner_done.wait(self.stop_timeout)
        return self.link.learner_done.is_set()

    def _stop_exit(self):
        self.link.shutdown.set()


class _ThreadFailed(RuntimeError):
    """A thread of the agent failed; its exit code becomes the agent's."""

    def __init__(self, message, exitcode):
        super().__init__(message)
        self.exitcode = exitcode
