"""`ReplicaSync`: the learner's decisions alone, and as one of several
replicas with decisions from a stand-in for the replicas' clock server."""

import threading

import elements
import pytest

import embodied
from embodied.core import clock
from embodied.run.parallel.learner_replicas import ReplicaSync
from embodied.run.parallel.link import AgentLink


def make_args(replicas, save_every=100):
    return elements.Config(replicas=replicas, replica=1, save_every=save_every)


class Decisions:
    """A clock link whose answers the test sets per clock, in the order
    the clocks were made (go on, eval ready, save)."""

    def __init__(self):
        self.answers = []
        self.periods = []

    def create(self, every, first):
        self.answers.append(True)
        self.periods.append(every)
        return len(self.answers) - 1

    def should(self, clockid, skip):
        return not skip and self.answers[clockid]


@pytest.fixture
def decisions():
    link = Decisions()
    clock.use(link)
    yield link
    clock.use(None)


def test_alone_goes_on_until_the_stream_ends_or_a_stop():
    link, stop = AgentLink(), threading.Event()
    sync = ReplicaSync(make_args(1), link, tag=40)
    assert not sync.replicated
    assert sync.go_on({'batch': 1}, stop)
    assert not sync.go_on(None, stop)
    assert not stop.is_set()
    stop.set()
    assert not sync.go_on({'batch': 1}, stop)
    sync.updated()
    sync.share_steps(logger=None)  # Alone: nothing to exchange.
    assert sync.eval_ready(True) and not sync.eval_ready(False)
    assert link.learner_stats() == {}


def test_a_replica_stops_when_another_did(decisions, capsys):
    link, stop = AgentLink(), threading.Event()
    sync = ReplicaSync(make_args(2), link, tag=40)
    assert link.learner_stats()['run_tag'] == 40  # Counts on from the save.
    assert sync.go_on({'batch': 1}, stop)
    decisions.answers[0] = False  # Another replica has no batch, or stops.
    assert not sync.go_on({'batch': 1}, stop)
    assert stop.is_set()
    assert link.learner_stats()['replica_stop'] == 1
    assert 'Learner: another replica stopped the run.' in capsys.readouterr().out


def test_replicas_save_under_the_runs_update_count(decisions):
    link = AgentLink()
    sync = ReplicaSync(make_args(2), link, tag=40)
    decisions.answers[2] = False  # Not yet time to save.
    sync.updated()
    sync.updated()
    assert link.learner_stats()['run_tag'] == 42
    assert 'save_request' not in link.learner_stats()
    decisions.answers[2] = True
    sync.updated()
    assert link.learner_stats()['save_request'] == 43


def test_replicas_make_their_clocks_in_one_order(decisions):
    """Global clocks pair up across replicas by the order they were made."""
    embodied.GlobalClock(5)  # The learner's own clocks come first.
    ReplicaSync(make_args(2, save_every=100), AgentLink(), tag=None)
    # Then go on and eval ready (every call), then saves.
    assert decisions.periods == [5, -1, -1, 100]
