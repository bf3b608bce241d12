"""What the actor and learner threads of the agent role share (a thread of
the launcher by default, a process with `run.agent_process True`)."""

import collections
import dataclasses
import threading
from typing import Any

_new = lambda cls: dataclasses.field(default_factory=cls)


@dataclasses.dataclass(eq=False)
class AgentLink:
    """The state the actor thread, the learner thread and the agent's control
    methods (`AgentControl`) share; beside each field, what guards it."""

    # Synchronises itself. The actor collects no data before the learner
    # restored the agent.
    barrier: threading.Barrier = dataclasses.field(
        default_factory=lambda: threading.Barrier(2))
    # Guards the agent's train state: agent.train / agent.report run under
    # it, and so does a save (`checkpoint.save` reads the parameters).
    train_lock: threading.Lock = _new(threading.Lock)
    # Written by the learner before `barrier.wait()`, read after it by
    # `save`: the barrier orders the two.
    checkpoint: Any = None
    # With the policy in a process of its own: the `param_sync.Publisher`
    # of its parameters, set once by the agent's control thread after
    # `barrier.wait()`, read by the learner's logs (policy lag).
    publisher: Any = None
    # Events synchronise themselves. The learner stops when `learner_stop`
    # is set and sets `learner_done` when it has ended; `shutdown` ends the
    # actor's server.
    learner_stop: threading.Event = _new(threading.Event)
    learner_done: threading.Event = _new(threading.Event)
    shutdown: threading.Event = _new(threading.Event)
    # Guarded by `learner_lock`: the learner's progress counters, written by
    # the learner thread and its streams, read by the control's `status`.
    # Use `count`, `record` and `learner_stats`.
    learner: collections.Counter = _new(collections.Counter)
    learner_lock: threading.Lock = _new(threading.Lock)

    def count(self, key, amount=1):
        """Adds `amount` to the learner's counter `key`."""
        with self.learner_lock:
            self.learner[key] += amount

    def record(self, key, value):
        """Sets the learner's counter `key` to `value`."""
        with self.learner_lock:
            self.learner[key] = value

    def learner_stats(self):
        """A copy of the learner's counters."""
        with self.learner_lock:
            return dict(self.learner)

    def abort(self):
        """Frees a thread waiting at the barrier when the other one failed."""
        self.barrier.abort()


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
            link = barrier.embodied_link = AgentLink(barrier=barrier)
        return link
