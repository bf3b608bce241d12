"""The launcher's state machine over fakes of the roles' clients and
workers: the states it visits and the control calls, in order."""

import pytest

from embodied import rpc
from embodied.run import arguments
from embodied.run.parallel import lifecycle
from embodied.run.parallel.lifecycle import State

pytestmark = pytest.mark.timeout(60)

STEP = 100


class Reply:
    def __init__(self, value):
        self.value = value

    def wait(self, timeout):
        return True

    def result(self, timeout=None):
        return self.value


class FakeClient:
    """Records each call in `log` as (role, method, *args)."""

    connected = True

    def __init__(self, role, log, drained):
        self.role, self.log, self.drained = role, log, drained

    def call(self, method, *args):
        self.log.append((self.role, method, *args))
        if method == 'status':
            return Reply({'step': STEP, 'run_step': STEP, 'score': 1.0,
                          'env_steps': STEP} if self.role == 'logger' else {})
        if method == 'quiesce':
            return Reply(self.drained() if self.role == 'agent' else True)
        return Reply(args[0] if method == 'save' else True)

    def close(self, timeout):
        pass


class FakeWorker:
    """A worker of the group that exits once its role was told to."""

    pid = None

    def __init__(self, name, role, log):
        self.name, self.role, self.log = name, role, log

    @property
    def exitcode(self):
        return 0 if (self.role, 'stop', 'exit') in self.log else None

    def kill(self):
        self.log.append((self.role, 'killed'))


class FakePool:
    """The env workers (`env.pool`): none, their calls recorded."""

    names, slots, workers, restarts = [], [], [], 0

    def __init__(self, log):
        self.log = log

    def poll(self):
        pass

    def stopping(self):
        self.log.append(('envs', 'stopping'))

    def wait(self, timeout):
        self.log.append(('envs', 'wait'))
        return []

    def failed(self):
        return []

    def kill(self):
        self.log.append(('envs', 'kill'))


def make_launcher(tmp_path, drained=lambda: True, policy_worker='thread'):
    args = arguments.with_defaults(dict(
        logdir=str(tmp_path), remote_envs=True, drain_timeout=0.2,
        policy_worker=policy_worker))
    factories = dict.fromkeys(
        ('agent', 'logger', 'replay_train', 'replay_eval', 'stream',
         'env_train', 'env_eval'), b'')
    launcher = lifecycle.Launcher(factories, args)
    log = []
    workers = [('Agent', 'agent'), ('Logger', 'logger'), ('Replay', 'replay')]
    if policy_worker == 'process':
        workers.append(('Policy', 'policy'))
    launcher.clients = {role: FakeClient(role, log, drained)
                        for _, role in workers}
    launcher.group = rpc.Supervisor()
    for name, role in workers:
        launcher.group.add(FakeWorker(name, role, log))
    launcher.envs = FakePool(log)
    launcher.env_group.pool = launcher.envs
    return launcher, log


def control(log):
    return [call for call in log if call[1] != 'status']


SAVE = [('agent', 'save', STEP), ('replay', 'save', STEP),
        ('logger', 'save', STEP)]
QUIESCE = [('agent', 'quiesce'), ('replay', 'quiesce'), ('logger', 'quiesce')]
RESUME = [('logger', 'resume'), ('replay', 'resume'), ('agent', 'resume')]


def test_a_stop_drains_saves_and_ends_the_roles_in_order(tmp_path, capsys):
    launcher, log = make_launcher(tmp_path)
    launcher._enter(State.RUNNING)
    launcher._stop('Test stop')
    assert launcher.states == [
        State.STARTING, State.RUNNING, State.DRAINING, State.SAVING,
        State.STOPPING, State.STOPPED]
    assert control(log) == [
        ('envs', 'stopping'), *QUIESCE,
        ('agent', 'stop', 'learner'), ('replay', 'stop', 'release'),
        *QUIESCE, *SAVE,
        ('agent', 'stop', 'envs'), ('envs', 'wait'),
        ('agent', 'stop', 'exit'), ('replay', 'stop', 'exit'),
        ('logger', 'stop', 'exit')]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f'Test stop at step {STEP}: saving and stopping.'
    assert lines[1] == f'Saved checkpoints at step {STEP}.'
    assert lines[2].startswith('[Progress] ')
    assert lines[3].startswith('[Summary] ')
    assert lines[4:] == ['All workers exited.']


def test_a_save_drains_saves_and_runs_on(tmp_path):
    launcher, log = make_launcher(tmp_path)
    launcher._enter(State.RUNNING)
    assert launcher._save() == STEP
    assert launcher.states[1:] == [
        State.RUNNING, State.DRAINING, State.SAVING, State.RUNNING]
    assert control(log) == [
        *QUIESCE, *SAVE, *RESUME]


def test_a_save_whose_transitions_do_not_arrive_is_skipped(tmp_path, capsys):
    launcher, log = make_launcher(tmp_path, drained=lambda: False)
    launcher._enter(State.RUNNING)
    assert launcher._save() is None
    assert launcher.states[1:] == [
        State.RUNNING, State.DRAINING, State.RUNNING]
    assert not [call for call in log if call[1] == 'save']
    assert control(log)[-3:] == RESUME
    assert 'Skipping this save' in capsys.readouterr().out


def test_a_dead_replay_leaves_the_others_to_save_and_the_agent_to_exit(
        tmp_path):
    launcher, log = make_launcher(tmp_path)
    launcher._enter(State.RUNNING)
    launcher._fail(rpc.WorkerFailed('Replay', 1))
    assert launcher.state == State.FAILED
    assert control(log) == [
        ('agent', 'quiesce'), ('logger', 'quiesce'), ('agent', 'save', STEP),
        ('logger', 'save', STEP), ('agent', 'stop', 'exit')]


def test_a_full_disk_ends_the_roles_in_the_stops_order_without_saving(
        tmp_path):
    launcher, log = make_launcher(tmp_path)
    launcher._enter(State.RUNNING)
    launcher._end_unsaved()
    assert control(log) == [
        ('envs', 'stopping'),
        ('agent', 'stop', 'learner'), ('replay', 'stop', 'release'),
        ('agent', 'stop', 'envs'), ('envs', 'wait'),
        ('agent', 'stop', 'exit'), ('replay', 'stop', 'exit'),
        ('logger', 'stop', 'exit')]


def test_the_policy_worker_drains_first_resumes_last_and_exits_first(
        tmp_path):
    launcher, log = make_launcher(tmp_path, policy_worker='process')
    assert sorted(w.name for w in lifecycle.Launcher(
        dict.fromkeys(launcher_factories(), b''), launcher.args
    ).group.workers) == ['Agent', 'Logger', 'Policy', 'Replay']
    launcher._enter(State.RUNNING)
    assert launcher._save() == STEP
    assert control(log) == [
        ('policy', 'quiesce'), *QUIESCE, *SAVE, *RESUME,
        ('policy', 'resume')]
    log.clear()
    launcher._stop('Test stop')
    assert launcher.state == State.STOPPED
    policy_quiesce = [('policy', 'quiesce'), *QUIESCE]
    assert control(log) == [
        ('envs', 'stopping'), *policy_quiesce,
        ('agent', 'stop', 'learner'), ('replay', 'stop', 'release'),
        *policy_quiesce, *SAVE,
        ('policy', 'stop', 'envs'), ('agent', 'stop', 'envs'),
        ('envs', 'wait'),
        ('policy', 'stop', 'exit'), ('agent', 'stop', 'exit'),
        ('replay', 'stop', 'exit'), ('logger', 'stop', 'exit')]


def test_a_dead_policy_worker_leaves_the_saving_roles_to_save(tmp_path):
    launcher, log = make_launcher(tmp_path, policy_worker='process')
    launcher._enter(State.RUNNING)
    launcher._fail(rpc.WorkerFailed('Policy', -9))
    assert launcher.state == State.FAILED
    assert control(log) == [
        *QUIESCE, *SAVE, ('agent', 'stop', 'exit')]


def test_the_thread_mode_starts_no_policy_worker(tmp_path):
    launcher, _ = make_launcher(tmp_path)
    assert 'Policy' not in [w.name for w in lifecycle.Launcher(
        dict.fromkeys(launcher_factories(), b''), launcher.args
    ).group.workers]


def launcher_factories():
    return ('agent', 'logger', 'replay_train', 'replay_eval', 'stream',
            'env_train', 'env_eval')


def test_only_the_named_transitions_are_allowed(tmp_path):
    launcher, _ = make_launcher(tmp_path)
    with pytest.raises(RuntimeError, match='from starting to stopping'):
        launcher._enter(State.STOPPING)
    launcher._enter(State.RUNNING)
    launcher._enter(State.FAILED)  # From any state.
    with pytest.raises(RuntimeError, match='from failed to running'):
        launcher._enter(State.RUNNING)
