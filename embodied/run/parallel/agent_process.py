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

`AgentControl` is the agent's side of the control protocol
(lifecycle.py): status, quiesce, save, resume, stop. Its methods are served
on the actor's server at `run.actor_addr`, the one address the launcher,
the env workers and the original's env processes all know (each bound
method has its own threads, so a control call never waits behind `act`):
the actor thread, handed the control as an argument, binds it there beside
`act` before it starts the server.
`AgentLink` (link.py) is what the threads share, each field with its lock.
"""

import time

from embodied import rpc
from embodied.run import arguments
from embodied.run import roles
from embodied.run.parallel import connections
from embodied.run.parallel import lifecycle
from embodied.run.parallel.actor import parallel_actor
from embodied.run.parallel.learner import parallel_learner
from embodied.run.parallel.link import AgentLink
from embodied.run.reporting import prefix


# Thread ends that need no traceback: the launcher retries with other ports,
# or the thread's client printed why a peer never came or refused it.
_QUIET_ENDS = (rpc.supervisor.EXIT_PORT_TAKEN,
               rpc.supervisor.EXIT_UNREACHABLE, rpc.supervisor.EXIT_REFUSED)


def parallel_agent(make_agent, args):
    """One agent shared by the actor and learner threads."""
    args = arguments.normalize(args)
    agent = connections.loads(make_agent)()
    link = AgentLink()
    control = AgentControl(link, args)
    actor = rpc.Thread(
        parallel_actor, agent, link, args, control, name='Actor')
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


class AgentControl(lifecycle.RoleControl):
    """The agent's side of the control protocol (lifecycle.py), bound by
    `attach` on the actor's server. The methods run on the server's
    threads and touch the actor and learner only through `link` (under the
    locks it names) and the `act` method's queue. Stop stages: 'learner'
    (True once the learner ended), 'envs' (every `act` from now on gets the
    stop reply), 'exit' (ends the actor's server and thread)."""

    ROLE = 'agent'
    STAGES = roles.stage_names(ROLE)

    def __init__(self, link, args):
        self.link = link
        self.stop_timeout = args.connect_timeout
        self.server = None
        self.actor = None

    def attach(self, server, actor):
        """Binds the methods on `server`, whose `act` `actor` serves."""
        self.server, self.actor = server, actor
        connections.bind_role(server, self)

    def status(self):
        """The actor's counters, the learner's (`learner_` prefixed), the
        server's (`server/`) and the addresses of the last peers it refused
        (`refused_from`)."""
        return {
            **self.actor.stats(),
            **{f'learner_{k}': v for k, v in self.link.learner_stats().items()},
            **prefix(self.server.stats(), 'server'),
            'refused_from': list(self.server.socket.refused_from),
        }

    def quiesce(self):
        """Holds new `act` batches back; True once every transition the
        actor produced has arrived at the replay and the logger."""
        self.server.pause('act')
        return bool(self.server.idle('act') and self.actor.flush() and
                    self.actor.settle())

    def resume(self):
        self.server.resume('act')

    def save(self, tag):
        """Saves the agent under `tag`, between train steps."""
        with self.link.train_lock:
            self.link.checkpoint.save(int(tag))
        return int(tag)

    def _stop_learner(self):
        """Stops the learner after its current step; True once it ended."""
        self.link.learner_stop.set()
        self.link.learner_done.wait(self.stop_timeout)
        return self.link.learner_done.is_set()

    def _stop_envs(self):
        self.server.answer('act', {connections.STOP_KEY: True})

    def _stop_exit(self):
        self.link.shutdown.set()


class _ThreadFailed(RuntimeError):
    """A thread of the agent failed; its exit code becomes the agent's."""

    def __init__(self, message, exitcode):
        super().__init__(message)
        self.exitcode = exitcode
