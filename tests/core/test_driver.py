import os
from functools import partial as bind
from multiprocessing import resource_tracker

import numpy as np
import psutil
import pytest

import embodied
from embodied.core.driver import EnvError

Space = embodied.Space

# Portal's processes use semaphores, which start the resource tracker: one
# helper process that lives as long as this one. Starting it now keeps it out
# of the per-test check for leftover processes.
resource_tracker.ensure_running()


class CountEnv(embodied.Env):
    """Episodes of `length` steps; obs `count` and the env's `index`."""

    def __init__(self, index=0, length=3, fail_at=None):
        self.index = index
        self.length = length
        self.fail_at = fail_at
        self.count = 0
        self.steps = 0

    @property
    def obs_space(self):
        return {
            'count': Space(np.int32),
            'index': Space(np.int32),
            'pid': Space(np.int32),
            'log/steps': Space(np.int32),
            **embodied.core.base.step_spaces(),
        }

    @property
    def act_space(self):
        return {'action': Space(np.int32, (), 0, 5), 'reset': Space(bool)}

    def step(self, action):
        self.steps += 1
        if self.fail_at is not None and self.steps > self.fail_at:
            explode(self.index)
        self.count = 0 if action['reset'] else self.count + 1
        return {
            'count': np.int32(self.count),
            'index': np.int32(self.index),
            'pid': np.int32(os.getpid()),
            'log/steps': np.int32(self.steps),
            'reward': np.float32(action['action']),
            'is_first': self.count == 0,
            'is_last': self.count == self.length,
            'is_terminal': False,
        }


def explode(index):
    raise ZeroDivisionError(f'env {index} divided by zero')


def failing_ctor():
    raise OSError('cannot open the simulator')


def constant_policy(value):
    def policy(carry, obs, **kwargs):
        batch = len(obs['is_first'])
        return carry, {'action': np.full(batch, value, np.int32)}, {}
    return policy


def make_driver(parallel, count=2, **kwargs):
    fns = [bind(CountEnv, i, **kwargs) for i in range(count)]
    return embodied.Driver(fns, parallel=parallel)


def record(driver):
    trans = []
    driver.on_step(lambda tran, worker: trans.append((worker, tran)))
    return trans


@pytest.mark.parametrize('parallel', [False, True])
class TestDriver:

    def test_steps_episodes_and_resets(self, parallel):
        driver = make_driver(parallel, count=2, length=3)
        try:
            trans = record(driver)
            driver.reset()
            driver(constant_policy(2), steps=10)
            assert len(trans) == 10  # 5 steps of 2 envs.
            assert [w for w, _ in trans] == [0, 1] * 5
            pids = {int(t['pid']) for _, t in trans}
            if parallel:
                assert os.getpid() not in pids and len(pids) == 2
            else:
                assert pids == {os.getpid()}
            env0 = [t for w, t in trans if w == 0]
            assert all(t['index'] == 0 for t in env0)
            assert [int(t['count']) for t in env0] == [0, 1, 2, 3, 0]
            assert [bool(t['is_first']) for t in env0] == [1, 0, 0, 0, 1]
            assert [bool(t['is_last']) for t in env0] == [0, 0, 0, 1, 0]
            # Actions for last steps are zeroed; the env gets a reset next.
            # As in the original, transitions hold no `reset`.
            assert not any('reset' in t for t in env0)
            assert [int(t['action']) for t in env0] == [2, 2, 2, 0, 2]
            # The obs after a reset shows the action zeroed.
            assert [float(t['reward']) for t in env0] == [0, 2, 2, 2, 0]

            trans.clear()
            driver(constant_policy(1), episodes=3)
            # The envs continue where they were (count 0) and end episodes
            # together: after 3 steps 2 episodes, after 7 steps 4 >= 3.
            assert len(trans) == 14
            assert sum(bool(t['is_last']) for _, t in trans) == 4
        finally:
            driver.close()

    def test_policy_inputs_carry_and_logs(self, parallel):
        fns = [bind(CountEnv, i) for i in range(2)]
        driver = embodied.Driver(fns, parallel=parallel, mode='eval')
        try:
            seen = []

            def policy(carry, obs, mode):
                seen.append((carry, sorted(obs), mode))
                act = {'action': np.zeros(2, np.int32)}
                return carry + 1, act, {'value': np.float32([0.5, 1.5])}

            trans = []
            driver.on_step(lambda tran, worker, mode: trans.append(
                (worker, mode, tran)))
            driver.reset(lambda batch_size: batch_size * 10)
            driver(policy, steps=4)
            assert [carry for carry, _, _ in seen] == [20, 21]
            assert all(mode == 'eval' for _, _, mode in seen)
            assert not any(k.startswith('log/') for k in seen[0][1])
            assert 'count' in seen[0][1]
            worker, mode, tran = trans[1]
            assert worker == 1 and mode == 'eval'
            assert tran['log/steps'] == 1
            assert tran['value'] == np.float32(1.5)
            assert driver.carry == 22
        finally:
            driver.close()



def test_policy_missing_action():
    driver = make_driver(parallel=False)
    def policy(carry, obs):
        return carry, {}, {}
    with pytest.raises(ValueError, match=r"no action for \['action'\]"):
        driver(policy, steps=1)


def test_policy_action_without_batch_axis():
    driver = make_driver(parallel=False)
    def policy(carry, obs):
        return carry, {'action': np.int32(0)}, {}
    with pytest.raises(ValueError, match="act 'action' has shape \\(\\)"):
        driver(policy, steps=1)


def test_random_agent():
    driver = make_driver(parallel=False)
    spaces = CountEnv()
    agent = embodied.RandomAgent(spaces.obs_space, spaces.act_space, seed=0)
    # The original's carries: `()`, which the driver hands the policy first.
    assert agent.init_policy(2) == () and agent.init_train(2) == ()
    assert agent.init_report(2) == ()
    trans = record(driver)
    driver.reset(agent.init_policy)
    carries = []
    def policy(carry, obs):
        carries.append(carry)
        return (len(carries),), agent.policy(carry, obs)[1], {}
    driver(policy, steps=20)
    assert carries == [()] + [(i,) for i in range(1, 10)]
    actions = [int(t['action']) for _, t in trans if not t['is_last']]
    assert set(actions) <= set(range(5)) and len(set(actions)) > 1
    assert all(t['action'].dtype == np.int32 for _, t in trans)
    data = {'is_first': np.zeros((2, 3), bool)}
    assert agent.train((), data) == ((), {}, {})
    assert agent.report((), data) == ((), {})
    assert agent.stream(iter([1])) is not None


def test_env_error_in_process_names_index_and_traceback():
    children = psutil.Process().children
    fns = [bind(CountEnv, 0), bind(CountEnv, 1, fail_at=2)]
    driver = embodied.Driver(fns, parallel=True)
    pids = {worker.process.pid for worker in driver.workers}
    assert pids <= {c.pid for c in children()}
    with pytest.raises(EnvError) as info:
        driver(constant_policy(1), steps=100)
    message = str(info.value)
    assert info.value.index == 1
    assert message.startswith('Env 1 raised ZeroDivisionError')
    assert 'env 1 divided by zero' in message
    assert 'in explode' in info.value.remote_traceback
    assert 'Traceback' in message
    # The driver ended its env processes on the error.
    assert not pids & {c.pid for c in children() if c.is_running()
                       and c.status() != psutil.STATUS_ZOMBIE}
    driver.close()  # Still safe.
    with pytest.raises(RuntimeError, match='after close'):
        driver(constant_policy(1), steps=1)


def test_env_constructor_error_in_process():
    fns = [bind(CountEnv, 0), failing_ctor]
    with pytest.raises(EnvError) as info:
        embodied.Driver(fns, parallel=True)
    assert info.value.index == 1
    assert 'OSError: cannot open the simulator' in str(info.value)
    assert 'failing_ctor' in info.value.remote_traceback


def test_env_error_in_process_local_keeps_type():
    fns = [bind(CountEnv, 0, fail_at=1)]
    driver = embodied.Driver(fns, parallel=False)
    with pytest.raises(ZeroDivisionError) as info:
        driver(constant_policy(1), steps=5)
    assert 'Raised by env 0 of the driver.' in info.value.__notes__
    driver.close()


def test_close_ends_processes():
    driver = make_driver(True)
    procs = [worker.process for worker in driver.workers]
    assert all(proc.running for proc in procs)
    driver.close()
    assert not any(proc.running for proc in procs)
    assert all(proc.exitcode == 0 for proc in procs)


def test_env_process_killed():
    driver = make_driver(True)
    try:
        driver.workers[1].process.kill()
        with pytest.raises(EnvError, match='Env 1 process ended unexpectedly'):
            driver(constant_policy(1), steps=4)
    finally:
        driver.close()


def test_no_jax_in_env_process():
    def check_env():
        import sys
        assert 'jax' not in sys.modules, 'jax imported in env process'
        return CountEnv()
    driver = embodied.Driver([check_env], parallel=True)
    driver(constant_policy(1), steps=2)
    driver.close()
