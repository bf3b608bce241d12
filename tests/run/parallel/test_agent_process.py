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
from embodied.run.parallel import launcher as launcherlib
from embodied.run.parallel import lifecycle
from embodied.run.parallel.logger_server import LoggerRole
from embodied.run.parallel.replay_server import ReplayRole

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
    """The control calls the launcher (launcher.py) makes on `role`:
    (method, stop stage or None)."""
    tree = ast.parse(pathlib.Path(launcherlib.__file__).read_text())
    calls = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        if not isinstance(func, ast.Attribute):
            continue
        consts = [a.value for a in node.args if isinstance(a, ast.Constant)]
        if func.attr in ('_call', '_try_call') and consts[:1] == [role]:
            consts = consts[1:]  # self._call('actor', 'stop', 'learner')
        elif func.attr == '_stop_role' and consts == [role]:
            consts = ['stop', 'exit']
        elif func.attr == 'call' and isinstance(func.value, ast.Subscript):
            # self.clients['actor'].call(...), or self.clients[role].call(
            # 'save', step) for each role.
            key = func.value.slice
            if isinstance(key, ast.Constant) and key.value != role:
                continue
        else:
            continue
        if consts:
            stage = consts[1] if consts[0] == 'stop' else None
            calls.add((consts[0], stage))
    return calls


@pytest.mark.parametrize('role, cls', [
    ('actor', AgentControl), ('replay', ReplayRole), ('logger', LoggerRole)])
def test_the_launcher_calls_only_declared_methods_and_stages(role, cls):
    calls = launcher_calls(role)
    assert {('status', None), ('save', None), ('stop', 'exit')} <= calls
    methods = {method for method, _ in calls}
    assert methods <= set(lifecycle.CONTROL) | {'abandon'}
    assert methods <= set(cls.RPC)
    stages = {stage for _, stage in calls if stage}
    assert stages <= set(cls.STAGES), (stages, cls.STAGES)


def test_the_agent_serves_act_and_the_control_protocol(control):
    calls = launcher_calls('actor')
    assert {('quiesce', None), ('resume', None), ('stop', 'learner'),
            ('stop', 'envs')} <= calls
    assert {stage for _, stage in calls if stage} == set(AgentControl.STAGES)
    assert set(control.server.methods) == {'act', *lifecycle.CONTROL}
    assert set(AgentControl.RPC) == set(lifecycle.CONTROL)


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
