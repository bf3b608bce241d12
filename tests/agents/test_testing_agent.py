import threading
import time

import elements
import numpy as np
import pytest

from embodied.agents.testing import DataCheckError, TestAgent
from embodied.envs.dummy import Dummy

SIZE = (6, 5)
BATCH, LENGTH, CONTEXT = 3, 6, 1


def make_env(length=4):
    return Dummy('disc', size=SIZE, length=length)


def make_agent(**overrides):
    env = make_env()
    obs_space = {
        k: v for k, v in env.obs_space.items() if not k.startswith('log/')}
    act_space = {k: v for k, v in env.act_space.items() if k != 'reset'}
    config = dict(
        train_burn=0.0, check_order=True, check_content=True,
        replay_outs=False, seed=0, batch_size=BATCH, batch_length=LENGTH,
        replay_context=CONTEXT, logdir='/tmp/unused')
    config.update(overrides)
    return TestAgent(obs_space, act_space, elements.Config(**config))


def stack(items):
    return {k: np.stack([item[k] for item in items]) for k in items[0]}


def without_logs(obs):
    return {k: v for k, v in obs.items() if not k.startswith('log/')}


def rollout(env, steps, reset_at=()):
    """A trajectory of `steps` transitions as the replay would store them."""
    steps_data = []
    for index in range(steps):
        obs = env.step({'action': np.int32(1), 'reset': index in reset_at})
        steps_data.append({**without_logs(obs), 'action': np.int32(1)})
    return stack(steps_data)


def make_batch(length=LENGTH + CONTEXT, batch=BATCH):
    rows = []
    for index in range(batch):
        env = make_env()
        for _ in range(index):  # Different envs start at different counts.
            env.step({'action': 0, 'reset': False})
        rows.append(rollout(env, length, reset_at=(0,)))
    data = stack(rows)
    data['stepid'] = np.zeros((batch, length, 20), np.uint8)
    return data


def policy_steps(agent, envs, steps, carry=None):
    carry = agent.init_policy(len(envs)) if carry is None else carry
    obs = stack([without_logs(
        env.step({'action': 0, 'reset': True})) for env in envs])
    for _ in range(steps):
        carry, act, _ = agent.policy(carry, obs)
        obs = stack([without_logs(env.step({
            'action': act['action'][i], 'reset': False}))
            for i, env in enumerate(envs)])
    return carry, obs


def test_policy_accepts_in_order_counts_across_episodes():
    agent = make_agent()
    envs = [make_env(length=3), make_env(length=5)]
    carry, obs = policy_steps(agent, envs, 20)
    np.testing.assert_array_equal(carry['count'], [19, 19])
    carry, act, out = agent.policy(carry, obs)
    assert act['action'].shape == (2,) and act['action'].dtype == np.int32
    assert ((act['action'] >= 0) & (act['action'] < 4)).all()
    assert 'reset' not in act and out == {}
    assert agent.counters['policy_steps'] == 42
    assert agent.counters['policy_calls'] == 21


def test_policy_raises_on_out_of_order_count_naming_the_example():
    agent = make_agent()
    envs = [make_env(), make_env()]
    carry, obs = policy_steps(agent, envs, 3)
    skipped = stack([without_logs(obs) for obs in (
        envs[0].step({'action': 0, 'reset': False}),
        (envs[1].step({'action': 0, 'reset': False}),
         envs[1].step({'action': 0, 'reset': False}))[1])])
    carry, _, _ = agent.policy(carry, obs)
    with pytest.raises(
            DataCheckError, match='example 1 .*expected count 4, got 5'):
        agent.policy(carry, skipped)
    skipped['envid'] = np.array([10, 11])
    with pytest.raises(DataCheckError, match=r'example 1 \(envid 11\)'):
        agent.policy(carry, skipped)


def test_policy_allows_env_restart_only_at_count_zero_with_is_first():
    agent = make_agent()
    carry, obs = policy_steps(agent, [make_env()], 5)
    carry, _, _ = agent.policy(carry, obs)
    restarted = stack([without_logs(
        make_env().step({'action': 0, 'reset': True}))])
    agent.policy(carry, restarted)
    restarted['is_first'][:] = False
    with pytest.raises(DataCheckError, match='expected count 6, got 0'):
        agent.policy(carry, restarted)


def test_policy_accepts_list_leaf_carries():
    agent = make_agent()
    envs = [make_env(), make_env()]
    carry, obs = policy_steps(agent, envs, 4)
    # The parallel actor keeps one carry per env and passes lists of them.
    per_env = [{'count': carry['count'][i]} for i in range(2)]
    listed = {'count': [entry['count'] for entry in per_env]}
    carry, _, _ = agent.policy(listed, obs)
    assert carry['count'][0] == obs['count'][0]
    assert carry['count'][1] == obs['count'][1]
    listed = {'count': [np.int64(obs['count'][0]), int(obs['count'][1]) + 5]}
    nxt = stack([without_logs(
        env.step({'action': 0, 'reset': False})) for env in envs])
    with pytest.raises(DataCheckError, match='example 1'):
        agent.policy(listed, nxt)


def test_train_accepts_consecutive_sequences_and_returns_numpy_metrics():
    agent = make_agent()
    carry = agent.init_train(BATCH)
    data = make_batch()
    carry, outs, metrics = agent.train(carry, data)
    carry, outs, metrics = agent.train(carry, data)
    assert outs == {}
    np.testing.assert_array_equal(carry['batches'], [2, 2, 2])
    assert metrics['train_batches'] == 2
    for value in metrics.values():
        assert isinstance(value, np.generic)
    _, report = agent.report(agent.init_report(BATCH), make_batch(length=4))
    assert report['reports'] == 1 and isinstance(report['reports'], np.generic)


def test_train_allows_restart_inside_a_sequence():
    agent = make_agent()
    data = make_batch()
    restarted = rollout(make_env(), 3, reset_at=(0,))
    for key, value in restarted.items():
        data[key][1, 4:] = value[:3]
    agent.train(agent.init_train(BATCH), data)


def test_train_raises_on_out_of_order_sequence():
    agent = make_agent()
    data = make_batch()
    for key in data:
        if key != 'stepid':
            data[key][2, [3, 4]] = data[key][2, [4, 3]]
    with pytest.raises(
            DataCheckError,
            match='train: sequence 2 is out of order at step 3: expected '
                  r'count \d+, got \d+'):
        agent.train(agent.init_train(BATCH), data)
    with pytest.raises(DataCheckError, match='report: sequence 2'):
        agent.report(agent.init_report(BATCH), data)


def test_train_checks_content_against_count():
    agent = make_agent()
    data = make_batch()
    data['image'][1, 2, 0, 3, 1] += 1
    with pytest.raises(DataCheckError, match="sequence 1 at step 2: 'image'"):
        agent.train(agent.init_train(BATCH), data)
    data = make_batch()
    data['vector'][0, 5] = data['vector'][0, 4]
    with pytest.raises(DataCheckError, match="sequence 0 at step 5: 'vector'"):
        agent.train(agent.init_train(BATCH), data)
    relaxed = make_agent(check_content=False)
    relaxed.train(relaxed.init_train(BATCH), data)


def test_train_checks_shapes_and_keys():
    agent = make_agent()
    with pytest.raises(DataCheckError, match=r"data\['is_first'\] has shape "
                       r'\(3, 5\), expected \(batch, length\) = \(3, 7\)'):
        agent.train(agent.init_train(BATCH), make_batch(length=5))
    with pytest.raises(DataCheckError, match=r'= \(3, 7\)'):
        agent.train(agent.init_train(2), make_batch(batch=2))
    data = make_batch()
    del data['vector']
    with pytest.raises(DataCheckError, match="lacks 'vector'"):
        agent.train(agent.init_train(BATCH), data)


def test_check_order_false_disables_checks():
    agent = make_agent(check_order=False)
    data = make_batch(length=3)
    data['count'][:] = 7
    agent.train(agent.init_train(BATCH), data)
    carry = {'count': np.array([5])}
    obs = {'count': np.array([9]), 'is_first': np.array([False])}
    agent.policy(carry, obs)


def test_replay_outs_carry_stepid_and_context_from_count():
    agent = make_agent(replay_outs=True)
    data = make_batch()
    data['stepid'][:] = np.arange(20, dtype=np.uint8)
    _, outs, _ = agent.train(agent.init_train(BATCH), data)
    np.testing.assert_array_equal(outs['replay']['stepid'], data['stepid'])
    context = outs['replay']['testctx']
    assert context.dtype == np.float32 and context.shape == (BATCH, 7)
    np.testing.assert_array_equal(context, data['count'])


def test_counters_persist_through_save_and_load():
    agent = make_agent()
    policy_steps(agent, [make_env()], 3)
    agent.train(agent.init_train(BATCH), make_batch())
    agent.report(agent.init_report(BATCH), make_batch())
    saved = agent.save()
    resumed = make_agent()
    resumed.load(saved)
    assert resumed.counters == {
        'policy_calls': 3, 'policy_steps': 3, 'train_batches': 1,
        'reports': 1, 'saves': 1, 'loads': 1}
    _, _, metrics = resumed.train(resumed.init_train(BATCH), make_batch())
    assert metrics['train_batches'] == 2 and metrics['loads'] == 1
    partial = make_agent()
    partial.load(saved, regex='train_')
    assert partial.counters['train_batches'] == 1
    assert partial.counters['policy_steps'] == 0
    with pytest.raises(KeyError, match="unknown counters \\['bogus'\\]"):
        partial.load({'counters': {'bogus': 1}})


def test_train_burn_spends_cpu_time():
    agent = make_agent(train_burn=0.2)
    data = make_batch()
    start = time.process_time()
    _, _, metrics = agent.train(agent.init_train(BATCH), data)
    spent = time.process_time() - start
    assert spent >= 0.2
    assert metrics['burn_seconds'] >= 0.2
    with pytest.raises(ValueError, match='train_burn'):
        make_agent(train_burn=-1)


def test_actor_and_learner_threads_share_the_agent():
    agent = make_agent()
    data = make_batch()
    errors = []

    def actor():
        try:
            policy_steps(agent, [make_env(), make_env()], 200)
        except Exception as e:  # Reported by the main thread.
            errors.append(e)

    def learner():
        try:
            carry = agent.init_train(BATCH)
            for _ in range(50):
                carry, _, _ = agent.train(carry, data)
        except Exception as e:
            errors.append(e)

    threads = [
        threading.Thread(target=actor), threading.Thread(target=learner)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert agent.counters['policy_steps'] == 400
    assert agent.counters['train_batches'] == 50


def test_envs_without_count_get_shape_checks_only():
    from embodied.envs.cartpole import CartPole
    env = CartPole(seed=0)
    obs_space = dict(env.obs_space)
    act_space = {'action': env.act_space['action']}
    agent = TestAgent(obs_space, act_space, elements.Config(
        batch_size=2, batch_length=3, replay_context=0))
    carry = agent.init_policy(1)
    obs = stack([env.step({'action': 0, 'reset': True})])
    carry, act, _ = agent.policy(carry, obs)
    assert act['action'].shape == (1,)
    data = {
        key: np.zeros((2, 3) + space.shape, space.dtype)
        for key, space in {**obs_space, **act_space}.items()}
    agent.train(agent.init_train(2), data)
