"""What the actor and learner threads of the agent process share."""

import collections
import threading


class AgentLink(threading.Barrier):
    """The barrier between actor and learner, plus what they share: the lock
    that keeps saves out of train steps, the learner's stop event and its
    progress counters."""

    def __init__(self):
        super().__init__(2)
        self.train_lock = threading.Lock()
        self.learner_stop = threading.Event()
        self.learner_done = threading.Event()
        self.checkpoint = None
        self.learner = collections.Counter()


_LINKS_LOCK = threading.Lock()


def link_of(barrier):
    """The `AgentLink` given, or for a caller's own barrier (the original
    passes a plain `threading.Barrier` to the actor and the learner) one
    link made on first use and kept on the barrier, so both threads share
    it."""
    if isinstance(barrier, AgentLink):
        return barrier
    with _LINKS_LOCK:
        link = getattr(barrier, 'embodied_link', None)
        if link is None:
            link = barrier.embodied_link = AgentLink()
        return link
