"""The agent process's control methods and what its threads share,
in-process: a server that is bound but never started, no subprocesses."""

import ast
import pathlib
import threading

import helpers
import pytest

from embodied import rpc
from embodied.run import arguments
from embodied.run import connections
from embodied.run.parallel import link as linklib
from embodied.run.parallel.agent_process import AgentControl
from embodied.run.parallel import launch as launchlib
from embodied.run.parallel import save_and_stop

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


def launcher_calls(role):
    """The RPC methods the launcher (launch.py, save_and_stop.py) calls on
    `role`."""
    names = set()
    trees = [ast.parse(pathlib.Path(module.__file__).read_text())
             for module in (launchlib, save_and_stop)]
    for node in (node for tree in trees for node in ast.walk(tree)):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func, args = node.func, node.args
        consts = [a.value for a in args if isinstance(a, ast.Constant)]
        if isinstance(func, ast.Attribute) and func.attr == '_call':
            if consts[:1] == [role] and len(consts) > 1:
                names.add(consts[1])  # self._call('actor', 'pause')
        elif isinstance(func, ast.Attribute) and func.attr == 'call':
            target = func.value  # self.clients['actor'].call('save', ...)
            if (isinstance(target, ast.Subscript) and isinstance(
                    target.slice, ast.Constant) and
                    target.slice.value == role and consts):
                names.add(consts[0])
        elif isinstance(func, ast.Attribute) and func.attr == '_shutdown':
            if consts == [role]:
                names.add('shutdown')
    return names


def test_every_method_the_launcher_calls_on_the_agent_is_bound(control):
    calls = launcher_calls('actor')
    assert {'pause', 'drained', 'stop_learner', 'shutdown'} <= calls
    assert calls <= set(control.server.methods)
    assert calls <= set(AgentControl.RPC)  # Each declared, as a control.
    # The names the launcher has always called, on the one agent server.
    assert set(control.server.methods) == {
        'act', 'status', 'pause', 'resume', 'drained', 'save',
        'stop_learner', 'stop_envs', 'shutdown'}


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
    assert control.stop_learner() is True


def test_pause_drained_stop_envs_and_shutdown(control):
    server = control.server
    control.pause()
    assert server.methods['act'].paused
    assert control.drained()  # Nothing sent, nothing running.
    control.resume()
    assert not server.methods['act'].paused
    control.stop_envs()
    assert server.methods['act'].fixed == {connections.STOP_KEY: True}
    control.shutdown()
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
