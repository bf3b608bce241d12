"""The agent process's control methods and what its threads share,
in-process: a server that is bound but never started, no subprocesses."""

import threading

import helpers
import pytest

from embodied import rpc
from embodied.run import arguments
from embodied.run.parallel import connections
from embodied.run.parallel import link as linklib
from embodied.run.parallel.agent import AgentControl
from embodied.run.parallel import control as controllib

from .test_actor_role import make_actor, obs

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def control():
    link = linklib.AgentLink()
    args = arguments.with_defaults(dict(logdir='/tmp/unused',
                                        connect_timeout=10))
    control = AgentControl(link, args)
    actor, _, _ = make_actor()
    server = rpc.Server('localhost:0', 'Actor')
    server.bind('act', actor.act, actor.send)
    control.attach(server, actor)
    yield control
    server.close()


def test_the_agent_serves_act_and_the_control_protocol(control):
    # The launcher calls the stages of `roles.TABLE` (test_lifecycle.py
    # follows its calls in order; test_rpc_table.py checks the stages).
    assert set(control.server.methods) == {
        'act', 'policy_buffer', *controllib.CONTROL}
    assert set(AgentControl.RPC) == {'policy_buffer', *controllib.CONTROL}
    assert control.policy_buffer() == {}  # No policy process to feed.


def test_an_unknown_stop_stage_names_the_role_and_stage(control):
    with pytest.raises(ValueError, match="agent has no stop stage 'logger'"):
        control.stop('logger')


def test_status_reads_learner_counters_while_new_keys_arrive(control):
    link = control.link
    stop = threading.Event()

    def learner():
        i = 0
        while not stop.is_set():
            link.count(f'key_{i % 500}', 1.0)
            i += 1
    thread = threading.Thread(target=learner, daemon=True)
    thread.start()
    try:
        for _ in range(200):
            status = control.status()
    finally:
        stop.set()
        thread.join(10)
    assert any(k.startswith('learner_key_') for k in status)
    assert status['carries'] == 0 and 'server/dropped' in status


def test_status_holds_actor_learner_and_server_counts(control):
    control.actor.act(obs([0, 1], [0, 0]))
    control.link.count('train_steps')
    control.link.count('train_seconds', 0.5)
    status = control.status()
    assert status['policy_steps'] == 2 and status['carries'] == 2
    assert status['learner_train_steps'] == 1
    assert status['learner_train_seconds'] == 0.5


def test_save_waits_for_the_train_step(control):
    link = control.link
    link.checkpoint = checkpoint = helpers.LockedCheckpoint(link.train_lock)
    link.train_lock.acquire()  # A train step is running.
    thread = threading.Thread(target=control.save, args=(40,), daemon=True)
    thread.start()
    thread.join(0.2)
    assert thread.is_alive() and not checkpoint.saved
    link.train_lock.release()
    thread.join(10)
    assert checkpoint.saved == [40]


def test_stop_learner_returns_once_the_learner_ended(control):
    link = control.link

    def learner():
        link.learner_stop.wait()
        link.learner_done.set()
    threading.Thread(target=learner, daemon=True).start()
    assert control.stop('learner') is True


def test_quiesce_resume_and_the_stop_stages_envs_and_exit(control):
    server = control.server
    assert control.quiesce()  # Nothing sent, nothing running.
    assert server.methods['act'].paused
    assert control.quiesce()  # The launcher polls it.
    control.resume()
    assert not server.methods['act'].paused
    control.stop('envs')
    assert server.methods['act'].fixed == {connections.STOP_KEY: True}
    assert not control.link.shutdown.is_set()
    control.stop('exit')
    assert control.link.shutdown.is_set()


def test_actor_and_learner_share_one_link_for_a_plain_barrier():
    """The original hands parallel_actor and parallel_learner a plain
    threading.Barrier; both find the same link, waiting on that barrier."""
    barrier = threading.Barrier(2)
    first = linklib.link_of(barrier)
    assert linklib.link_of(barrier) is first and first.barrier is barrier
    assert linklib.link_of(threading.Barrier(2)) is not first
    own = linklib.AgentLink()
    assert linklib.link_of(own) is own
