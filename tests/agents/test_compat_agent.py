"""An agent written for the original `embodied.jax` (tests/support/
fixtures/compat_agent.py) runs on this package: built, trained, checkpointed, and
trained by the `train` and `parallel` scripts."""

import json

import elements
import jax
import numpy as np
import pytest

import helpers
import launch
from embodied import factories
from embodied import main as mainlib

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings('ignore::DeprecationWarning')]

# tests/support is on sys.path (conftest.py puts it there; the scripts below
# get it through launch.env()).
AGENT = 'fixtures.compat_agent:CompatAgent'
OBS, ACT = helpers.OBS_SPACE, helpers.ACT_SPACE


def make_agent(tmpdir, seed=0):
    config = mainlib.parse([
        '--configs', 'debug', '--agent_impl', AGENT, '--logdir', str(tmpdir),
        '--seed', str(seed), '--agent.opt.lr', '3e-3',
        '--agent.opt.warmup', '0'])
    agent_config = elements.Config(
        **config.agent, logdir=config.logdir, seed=config.seed,
        jax=config.jax, batch_size=config.batch_size,
        batch_length=config.batch_length,
        replay_context=config.replay_context)
    ctor = factories._import(factories.agent_path(AGENT))
    return ctor(OBS, ACT, agent_config)


def make_batch(B=8, T=12, seed=0):
    """Reward = first observation dimension, so the reward head can fit it."""
    rng = np.random.default_rng(seed)
    vector = rng.normal(size=(B, T, 4)).astype(np.float32)
    return {
        'vector': vector,
        'reward': vector[..., 0].copy(),
        'is_first': np.zeros((B, T), bool),
        'is_last': np.zeros((B, T), bool),
        'is_terminal': np.zeros((B, T), bool),
        'action': rng.integers(0, 2, (B, T)).astype(np.int32),
        'stepid': rng.integers(0, 255, (B, T, 20)).astype(np.uint8),
    }


def make_obs(B, seed=0):
    rng = np.random.default_rng(seed)
    return {
        'vector': rng.normal(size=(B, 4)).astype(np.float32),
        'reward': np.zeros(B, np.float32), 'is_first': np.ones(B, bool),
        'is_last': np.zeros(B, bool), 'is_terminal': np.zeros(B, bool)}


@pytest.fixture(scope='module')
def agent(tmp_path_factory):
    return make_agent(tmp_path_factory.mktemp('compat'))


def test_builds_from_original_style_model(agent):
    from fixtures.compat_agent import CompatAgent
    assert isinstance(agent, __import__('embodied').jax.Agent)
    assert isinstance(agent.model, CompatAgent)
    names = agent.save()
    for prefix in ('enc/', 'logits/', 'rew/', 'val/', 'slowval/', 'retnorm/',
                   'opt/'):
        assert any(k.startswith(prefix) for k in names), (prefix, list(names))
    assert agent._policy_params and all(
        k.startswith(('enc/', 'logits/')) for k in agent._policy_params)


def test_policy_samples_and_eval_is_deterministic(agent):
    obs = make_obs(256)
    carry, act, _ = agent.policy(agent.init_policy(256), obs)
    assert act['action'].dtype == np.int32 and act['action'].shape == (256,)
    assert set(np.unique(act['action'])) == {0, 1}  # sampled, both classes
    np.testing.assert_array_equal(
        np.asarray(carry['prevact']).sum(-1), np.ones(256))
    first = agent.policy(agent.init_policy(256), obs, mode='eval')[1]
    again = agent.policy(agent.init_policy(256), obs, mode='eval')[1]
    np.testing.assert_array_equal(first['action'], again['action'])


def test_training_fits_reward_and_moves_slow_critic(agent):
    batch = make_batch(seed=1)
    slow_before = {k: v for k, v in agent.save().items()
                   if k.startswith('slowval/')}
    carry = agent.init_train(8)
    history = []
    for _ in range(300):
        carry, _, metrics = agent.train(carry, batch)
        history.append(float(metrics['loss/rew']))
        if history[-1] < 0.5 * history[0]:
            break
    assert history[-1] < 0.5 * history[0], (history[0], history[-5:])
    after = agent.save()
    assert any(not np.allclose(v, after[k]) for k, v in slow_before.items())
    assert np.asarray(carry['prevact']).shape == (8, 2)
    _, report = agent.report(agent.init_report(8), batch)
    assert {'loss/rew', 'loss/value', 'loss/policy'} <= set(report)


def test_checkpoint_round_trip_reproduces_actions(agent, tmp_path):
    agent.train(agent.init_train(8), make_batch())
    # The policy swaps in the update's parameters once their copy is made.
    jax.block_until_ready(agent._policy_params)
    other = make_agent(tmp_path, seed=1)
    other.load(agent.save())
    obs = make_obs(64, seed=2)
    mine = agent.policy(agent.init_policy(64), obs, mode='eval')[1]
    theirs = other.policy(other.init_policy(64), obs, mode='eval')[1]
    np.testing.assert_array_equal(mine['action'], theirs['action'])


def test_bad_agent_impl_is_a_usage_error():
    with pytest.raises(mainlib.UsageError, match='module:Class'):
        mainlib.parse(['--agent_impl', 'nonsense'])


@pytest.mark.parametrize('script, flags', helpers.SCRIPTS)
def test_trains_under_script(tmp_path, script, flags):
    logdir = tmp_path / 'run'
    result = launch.run(
        '--configs', 'debug', '--agent_impl', AGENT,
        '--task', 'cartpole_balance', '--script', script,
        '--run.steps', '400', '--logdir', logdir, *flags, timeout=600)
    output = result.stdout
    assert result.returncode == 0, output[-4000:]
    lines = (logdir / 'metrics.jsonl').read_text().splitlines()
    records = [json.loads(line) for line in lines]
    trained = [r for r in records if 'train/loss/value' in r]
    assert trained, output[-4000:]
    assert all(np.isfinite(r['train/loss/value']) for r in trained)
    # How many updates old the acting parameters were, per log interval.
    lags = [r for r in records if 'policy_lag/max' in r]
    assert lags, output[-4000:]
    assert all(0 <= r['policy_lag/mean'] <= r['policy_lag/max'] for r in lags)
    assert max(r['step'] for r in records) >= 400
    assert (logdir / 'ckpt').exists()
