"""The agent process: one agent shared by the actor and learner threads.

    parallel_agent(make_agent, args):
        agent = make_agent()
        start Thread(parallel_actor, agent, link)     # serves 'act', see actor.py
        start Thread(parallel_learner, agent, link)   # trains, see learner.py
        wait; a failed thread ends the process with its exit code

`AgentLink` is what the two threads share: a barrier (the actor collects no
data before the learner restored the checkpoint), the lock that keeps saves
out of train steps, the learner's stop event and its progress counters.
"""

import time

from embodied import rpc
from embodied.run import arguments
from embodied.run import wiring
from embodied.run.parallel.actor import parallel_actor
from embodied.run.parallel.learner import parallel_learner
from embodied.run.parallel.link import AgentLink


def parallel_agent(make_agent, args):
    """One agent shared by the actor and learner threads."""
    args = arguments.normalize(args)
    agent = wiring.loads(make_agent)()
    link = AgentLink()
    actor = rpc.Thread(parallel_actor, agent, link, args, name='Actor')
    learner = rpc.Thread(parallel_learner, agent, link, args, name='Learner')
    actor.start()
    learner.start()
    while actor.exitcode is None or learner.exitcode is None:
        for thread in (actor, learner):
            if thread.exitcode not in (None, 0):
                link.abort()
                if thread.exitcode == rpc.supervisor.EXIT_PORT_TAKEN:
                    return thread.exitcode  # The launcher retries.
                raise _ThreadFailed(
                    f'The {thread.name.lower()} thread failed: '
                    f'{thread.error or f"exit code {thread.exitcode}"}',
                    thread.exitcode)
        if learner.exitcode == 0 and not link.learner_stop.is_set():
            return 1  # The learner must only end when asked to.
        time.sleep(0.05)
    return 0


class _ThreadFailed(RuntimeError):
    """A thread of the agent failed; its exit code becomes the agent's."""

    def __init__(self, message, exitcode):
        super().__init__(message)
        self.exitcode = exitcode
