"""The policy in a process of its own (`run.policy_worker process`): the
parameters it acts with come from the learner through shared memory, a
DreamerV3 `debug` run with it runs to its steps, saves, and resumes, and
with the test agent (no parameters to send, so cheap) its envs can be a
separate command and its death ends the run with the saves intact."""

import functools
import glob
import os
import re
import signal

import elements
import numpy as np
import pytest

import launch
import metrics_reference
from embodied.jax import compiling
from embodied.jax import param_sync
from tests.jax.test_jax_agent import ACT, OBS, ToyAgent
from tests.jax.test_jax_agent import make_batch, make_config, make_obs
from tests.jax.test_param_sync import wait_until

from . import test_parallel
from .test_faults import wait_step, worker_pid


def test_synced_each_update_the_policy_worker_acts_as_the_thread_mode(
        tmp_path):
    """A learner's agent publishes after every update; an agent built for
    acting only, as the policy process builds it, installs each generation
    from the buffer. For the same inputs and seed both policies give the
    same actions and outputs, after every update."""
    config = elements.Config(
        **make_config(seed=0), batch_size=4, batch_length=5,
        policy_batches={'train': [4]})
    learner = ToyAgent(OBS, ACT, config)
    with compiling.building('policy'):
        acting = ToyAgent(OBS, ACT, config)
    # Built for acting only: the policy compiled ahead, train not at all.
    assert learner.wait_compiled(120) and learner.traces['train']
    assert acting.traces['policy'] and not acting.traces['train']
    publisher = param_sync.Publisher(
        learner.policy_params, lambda: learner.updates, every=1,
        directory=tmp_path)
    subscriber = param_sync.Subscriber(
        publisher.path, publisher.layout, acting.policy_shardings,
        acting.set_policy_params)
    try:
        assert subscriber.wait(30)
        subscriber.start()
        carry, obs = learner.init_policy(4), make_obs(seed=1)
        acting.init_policy(4)  # The same seed streams' positions.
        train = learner.init_train(4)
        before = learner.policy(carry, obs)[2]['logits']
        np.testing.assert_array_equal(
            before, acting.policy(carry, obs)[2]['logits'])
        for i in range(3):
            train, _, _ = learner.train(train, make_batch(seed=i))
            wait_until(lambda: subscriber.version == learner.updates)
            _, act_thread, out_thread = learner.policy(carry, obs)
            _, act_process, out_process = acting.policy(carry, obs)
            np.testing.assert_array_equal(
                act_thread['action'], act_process['action'])
            np.testing.assert_array_equal(
                out_thread['logits'], out_process['logits'])
            subscriber.lag()
        # Training moved the parameters the acting agent acts with.
        assert not np.allclose(before, out_process['logits'])
        assert publisher.lags() == {
            'policy_lag/mean': 0, 'policy_lag/max': 0}
    finally:
        subscriber.close()
        publisher.close()


def test_acting_with_parameters_of_another_layout_names_them():
    agent = ToyAgent(OBS, ACT, make_config())
    with pytest.raises(KeyError, match='policy parameters missing'):
        agent.set_policy_params({}, 1)


def test_each_launch_of_the_policy_worker_draws_its_own_seeds():
    """A resumed run's policy process does not draw the seeds of the
    launches before it: its stream starts at the learner's update count."""
    from embodied.run.parallel import policy as policy_role
    agent = ToyAgent(OBS, ACT, make_config())
    carry, obs = agent.init_policy(4), make_obs()
    first = agent.policy(carry, obs)[1]['action']
    policy_role._new_seeds(agent, 0)
    assert agent.save()['rng/policy'] == 0
    np.testing.assert_array_equal(agent.policy(carry, obs)[1]['action'],
                                  first)  # The same stream position.
    policy_role._new_seeds(agent, 7)
    assert agent.save()['rng/policy'] == 7 << 32


def test_the_policy_worker_of_a_replica_joins_nothing_and_draws_its_seeds(
        monkeypatch):
    """A replica's policy process stays out of JAX's distributed runtime
    (its replica's agent joins it) and acts with seeds that hold the
    replica's index, as the agent of that replica would."""
    from embodied.jax import distributed
    from embodied.jax import hosts
    from embodied.run.parallel import policy as policy_role
    monkeypatch.setattr(distributed, '_local', {})
    agent = ToyAgent(OBS, ACT, make_config())
    carry, obs = agent.init_policy(4), make_obs()
    actions, entropies = [], []
    for replica in (0, 1):
        distributed.stay_local(replica, 2)
        config = elements.Config(
            replica=replica, replicas=2,
            jax={'coordinator_address': '127.0.0.1:1'})
        assert distributed.start(config) is False
        assert not distributed.started()
        entropies.append(hosts.seed_entropy('policy', [0, 1, 2]))
        policy_role._new_seeds(agent, 3)
        actions.append(agent.policy(carry, obs)[1]['action'])
    assert entropies == [[0, 1, 2, 0], [0, 1, 2, 1]]
    assert hosts.policy_init_stream() == 'policy'
    assert not np.array_equal(*actions)


def test_each_process_builds_its_part_in_its_share_of_gpu_memory(
        monkeypatch):
    from embodied.run import arguments
    from embodied.run.parallel import agent as agent_role
    variable = agent_role.MEMORY_VARIABLE
    monkeypatch.delenv(variable, raising=False)
    monkeypatch.delenv(agent_role.MEMORY_MARK, raising=False)
    args = arguments.normalize(dict(
        logdir='/tmp/unused', policy_memory=0.2, agent_memory=0.5))
    part = lambda: compiling._PART
    assert agent_role.build(part, args) is None
    assert variable not in os.environ  # The thread mode sets nothing.
    assert agent_role.build(part, args, 'learner') == 'learner'
    assert os.environ[variable] == '0.5'
    # A process started from this one (the env of a later launch's policy
    # process) inherits the share, and sets its own.
    assert agent_role.build(part, args, 'policy') == 'policy'
    assert os.environ[variable] == '0.2'
    assert compiling._PART is None
    # The user's own share wins.
    monkeypatch.delenv(agent_role.MEMORY_MARK)
    monkeypatch.setenv(variable, '0.9')
    agent_role.build(part, args, 'learner')
    assert os.environ[variable] == '0.9'


def params_files():
    return set(glob.glob('/dev/shm/embodied-params-*'))


@pytest.mark.slow
def test_a_debug_run_with_the_policy_worker_saves_and_resumes(tmp_path):
    logdir = tmp_path / 'run'
    flags = ('--configs', 'debug', '--script', 'parallel',
             '--run.policy_worker', 'process', '--run.envs', '2',
             '--run.eval_envs', '0', '--run.log_every', '1',
             '--logger.outputs', 'jsonl', '--logdir', logdir)
    before = params_files()

    def run(steps, name):
        proc = launch.Launch(*flags, '--run.steps', steps,
                             logfile=tmp_path / f'{name}.log')
        tree = test_parallel.Tree(proc.proc)
        try:
            code, output = test_parallel.finish(proc, tree, timeout=400)
        finally:
            proc.kill()
        assert code == 0, output[-4000:]
        assert 'Traceback' not in output, output[-4000:]
        return output

    output = run(300, 'first')
    assert re.search(r'Workers: Policy \(pid \d+\), Agent', output), (
        output[:2000])
    assert 'Reached run.steps (300)' in output
    assert 'All workers exited.' in output
    saved = launch.saved_tags(logdir, 'agent')[-1]
    assert saved >= 300
    assert launch.saved_tags(logdir, 'logger')[-1] == saved
    assert not (logdir / 'ckpt' / 'policy').exists()  # Nothing of its own.
    # The policy acted with the learner's parameters: the lag flowed back.
    assert launch.latest_value(logdir, 'policy_lag/max') is not None
    # DreamerV3's keys under the parallel runner are on docs/metrics.md.
    metrics_reference.check(metrics_reference.logged(logdir))

    output = run(saved + 150, 'second')
    assert f'Learner resumed the agent from the save at step {saved}' in (
        output)
    assert launch.saved_tags(logdir, 'agent')[-1] >= saved + 150
    if os.path.isdir('/dev/shm'):
        assert params_files() <= before, 'a parameter buffer was left'


PROCESS = ('--run.policy_worker', 'process')


@pytest.mark.slow
def test_remote_envs_reach_the_policy_worker_at_the_actors_address(
        tmp_path):
    logdir = tmp_path / 'run'
    actor, = test_parallel.launch_ports(1)
    flags = ('--run.steps', '300', '--run.envs', '2', '--run.eval_envs', '0',
             '--run.actor_addr', f'localhost:{actor}', *PROCESS)
    run = functools.partial(test_parallel.start, logdir)
    outputs = test_parallel.finish_all([
        run('--run.remote_envs', 'True', *flags, name='main'),
        run(*flags, script='parallel_envs', name='envs')])
    assert 'Policy (pid' in outputs[0]
    assert 'Reached run.steps (300)' in outputs[0]
    assert launch.saved_tags(logdir, 'agent')[-1] >= 300


@pytest.mark.slow
def test_a_killed_policy_worker_is_named_and_the_others_save(tmp_path):
    logdir = tmp_path / 'run'
    proc = test_parallel.start(
        logdir, '--run.envs', '2', '--run.eval_envs', '0',
        '--run.steps', '1e6', *PROCESS)
    tree = test_parallel.Tree(proc.proc)
    try:
        wait_step(proc, tree, 100)
        os.kill(worker_pid(proc.output(), 'Policy'), signal.SIGKILL)
        code, output = test_parallel.finish(proc, tree, 60)
    finally:
        proc.kill()
    assert code != 0
    assert ("Ending the run: Worker 'Policy' ended unexpectedly (killed by "
            "SIGKILL, exit code -9)") in output
    saved = re.search(
        r'Saving what is left at step (\d+): agent, replay, logger', output)
    assert saved, output[-3000:]
    step = int(saved.group(1))
    for role in ('agent', 'replay', 'logger'):
        assert launch.saved_tags(logdir, role)[-1] == step
