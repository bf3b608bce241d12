"""DreamerV3 agent tests on CPU at the `debug` size. One compiled agent is
shared by the module; the persistent compilation cache keeps reruns fast."""

import os
import pathlib
import subprocess
import sys
import textwrap
import threading

import elements
import jax
import ninjax as nj
import numpy as np
import pytest

import helpers
import launch
import metrics_reference
from embodied import main as mainlib

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings('ignore::DeprecationWarning')]

OBS_SPACE, ACT_SPACE = helpers.OBS_SPACE, helpers.ACT_SPACE
ROOT = str(pathlib.Path(__file__).resolve().parents[2])


def make_config(tmpdir, *flags, seed=0):
    config = mainlib.parse([
        '--configs', 'debug', '--agent_impl', 'dreamerv3',
        '--logdir', str(tmpdir), '--seed', str(seed),
        '--agent.opt.lr', '1e-3', '--agent.opt.warmup', '0', *flags])
    return elements.Config(
        **config.agent, logdir=config.logdir, seed=config.seed,
        jax=config.jax, batch_size=config.batch_size,
        batch_length=config.batch_length, replay_context=config.replay_context,
        report_length=config.report_length, replica=0, replicas=1)


def make_agent(config, obs_space=OBS_SPACE, act_space=ACT_SPACE):
    """The agent, once it compiled train and report in the background: the
    tests trace its model directly (ninjax's name scope is process-wide)."""
    from embodied.agents.dreamerv3 import Agent
    agent = Agent(obs_space, act_space, config)
    assert agent.wait_compiled(600, report=True)
    return agent


def make_batch(config, length=None, seed=0):
    """A fixed batch from a smooth deterministic system, so the world model
    can fit it: the reward is the first observation dimension."""
    rng = np.random.default_rng(seed)
    B = config.batch_size
    T = (length or config.batch_length) + config.replay_context
    phase = rng.uniform(0, 2 * np.pi, (B, 1))
    t = np.arange(T)[None] * 0.3 + phase
    vector = np.stack([np.sin(t), np.cos(t), np.sin(2 * t), np.cos(2 * t)], -1)
    rssm = config.dyn.rssm
    return {
        'vector': vector.astype(np.float32),
        'reward': vector[..., 0].astype(np.float32),
        'is_first': np.zeros((B, T), bool),
        'is_last': np.zeros((B, T), bool),
        'is_terminal': np.zeros((B, T), bool),
        'action': rng.integers(0, 2, (B, T)).astype(np.int32),
        'stepid': rng.integers(0, 255, (B, T, 20)).astype(np.uint8),
        'consec': np.zeros((B, T), np.int32),
        'dyn/deter': np.zeros((B, T, rssm.deter), np.float32),
        'dyn/stoch': np.zeros((B, T, rssm.stoch, rssm.classes), np.float32),
    }


def make_obs(batch_size, seed=0):
    rng = np.random.default_rng(seed)
    return {
        'vector': rng.normal(size=(batch_size, 4)).astype(np.float32),
        'reward': np.zeros(batch_size, np.float32),
        'is_first': np.ones(batch_size, bool),
        'is_last': np.zeros(batch_size, bool),
        'is_terminal': np.zeros(batch_size, bool),
    }


@pytest.fixture(scope='module')
def config(tmp_path_factory):
    return make_config(tmp_path_factory.mktemp('dreamer'))


@pytest.fixture(scope='module')
def agent(config):
    return make_agent(config)


def test_losses_finite_with_right_shapes(agent, config):
    model = agent.model
    batch = agent._prepare_batch(make_batch(config), 'train')

    def losses(carry, batch):
        start, obs, prevact, _ = model._apply_context(carry, batch)
        loss, _ = model.loss(start, obs, prevact, training=True)
        losses, _, _, entries = model.losses(
            start, obs, prevact, training=True)
        return loss, losses, entries

    _, (loss, losses, entries) = jax.jit(nj.pure(losses))(
        agent._state, agent.init_train(config.batch_size), batch,
        seed=np.zeros(2, np.uint32))
    B, T = config.batch_size, config.batch_length
    expected = {
        'dyn': (B, T), 'rep': (B, T), 'vector': (B, T), 'rew': (B, T),
        'con': (B, T), 'policy': (B, T), 'value': (B, T), 'repval': (B, T - 1)}
    assert {k: v.shape for k, v in losses.items()} == expected
    for key, value in losses.items():
        assert np.isfinite(np.asarray(value)).all(), key
    assert np.isfinite(float(loss))
    assert entries['deter'].shape == (B, T, config.dyn.rssm.deter)


def test_reset_step_sees_no_previous_action(agent, config):
    """At an episode start the RSSM's step starts from the zero state and an
    all-zero action encoding, whatever the carry and the previous discrete
    action were (as the original; a masked action would encode class 0)."""
    import jax.numpy as jnp
    dyn = agent.model.dyn
    B = 3
    rng = np.random.default_rng(0)
    carry = {
        'deter': rng.normal(size=(B, config.dyn.rssm.deter)).astype(np.float32),
        'stoch': np.eye(config.dyn.rssm.classes, dtype=np.float32)[
            rng.integers(0, config.dyn.rssm.classes, (B, config.dyn.rssm.stoch))]}
    prevact = {'action': np.array([0, 1, 1], np.int32)}

    def steps(carry, prevact):
        _, feat = dyn.observe_step(
            carry, jnp.zeros((B, 8)), prevact, jnp.ones((B,), bool))
        # The same step from the zero state with an unavailable action (-1),
        # which the action encoding turns into zeros.
        zeros = jax.tree.map(jnp.zeros_like, carry)
        none = {'action': -jnp.ones((B,), jnp.int32)}
        _, expected = dyn.imagine_step(zeros, none)
        return feat['deter'], expected['deter']

    _, (deter, expected) = jax.jit(nj.pure(steps))(
        agent._state, carry, prevact, seed=np.zeros(2, np.uint32))
    np.testing.assert_allclose(deter, expected, rtol=1e-6, atol=1e-6)


def test_train_outputs_replay_context_and_metrics(agent, config):
    carry = agent.init_train(config.batch_size)
    batch = make_batch(config)
    carry, outs, metrics = agent.train(carry, batch)
    B, T = config.batch_size, config.batch_length
    replay = outs['replay']
    assert replay['stepid'].shape == (B, T, 20)
    np.testing.assert_array_equal(
        replay['stepid'], batch['stepid'][:, config.replay_context:])
    assert replay['dyn/deter'].shape == (B, T, config.dyn.rssm.deter)
    assert isinstance(replay['dyn/deter'], np.ndarray)
    for key, value in metrics.items():
        assert isinstance(value, np.ndarray), key
        assert np.isfinite(value).all(), key
    assert {'loss/dyn', 'loss/rep', 'loss/policy', 'rand/action'} <= set(metrics)
    _, report = agent.report(agent.init_report(B), make_batch(
        config, config.report_length))
    # The world model's losses; the actor-critic's come with train().
    losses = {k for k in report if k.startswith('loss/')}
    assert losses == {
        'loss/dyn', 'loss/rep', 'loss/rew', 'loss/con', 'loss/vector'}
    assert {'dyn_ent', 'rep_ent'} <= set(report)
    for key, value in report.items():
        assert np.isfinite(value).all(), key
    # What the runners log of them (prefixed train/, report/) is on
    # docs/metrics.md.
    metrics_reference.check(
        {f'train/{k}' for k in metrics} | {f'report/{k}' for k in report})


def test_world_model_loss_halves_on_fixed_batch(agent, config):
    batch = make_batch(config, seed=1)
    scales = dict(config.loss_scales)
    terms = {'dyn': scales['dyn'], 'rep': scales['rep'], 'vector': scales['rec'],
             'rew': scales['rew'], 'con': scales['con']}
    carry = agent.init_train(config.batch_size)
    history = []
    for _ in range(300):
        carry, _, metrics = agent.train(carry, batch)
        history.append(sum(metrics[f'loss/{k}'] * s for k, s in terms.items()))
        if history[-1] < 0.5 * history[0]:
            break
    assert history[-1] < 0.5 * history[0], (history[0], history[-10:])


def test_policy_accepts_list_carries_and_returns_numpy(agent):
    carry = agent.init_policy(2)
    carry, act, out = agent.policy(carry, make_obs(2))
    assert act['action'].dtype == np.int32 and act['action'].shape == (2,)
    assert out['dyn/deter'].shape[0] == 2
    islist = lambda x: isinstance(x, list)
    # The parallel actor's form: one entry per env, regrouped into lists.
    per_env = [elements.tree.map(lambda x: x[i], carry) for i in range(2)]
    listed = elements.tree.map(lambda *xs: list(xs), *per_env)
    listed, act, _ = agent.policy(listed, make_obs(2), mode='eval')
    leaves = jax.tree.leaves(listed, is_leaf=islist)
    assert all(islist(x) and len(x) == 2 for x in leaves)
    split = elements.tree.map(lambda x: x[1], listed, isleaf=islist)
    assert split['dyn']['deter'].shape == (agent.config.dyn.rssm.deter,)


def policy_head_params(agent):
    return jax.device_get({
        k: v for k, v in agent._policy_params.items() if k.startswith('pol/')})


def test_policy_and_train_run_concurrently(agent, config):
    errors = []
    before = policy_head_params(agent)
    stop = threading.Event()

    def actor():
        try:
            carry = agent.init_policy(2)
            while not stop.is_set():
                carry, _, _ = agent.policy(carry, make_obs(2))
        except Exception as e:  # noqa: BLE001 -- reported below
            errors.append(e)

    thread = threading.Thread(target=actor)
    thread.start()
    try:
        carry = agent.init_train(config.batch_size)
        batch = make_batch(config)
        for _ in range(20):
            carry, _, _ = agent.train(carry, batch)
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not errors, errors
    after = policy_head_params(agent)
    changed = jax.tree.map(lambda a, b: not np.allclose(a, b), before, after)
    assert any(jax.tree.leaves(changed))


def test_save_load_reproduces_actions(agent, config, tmp_path):
    agent.train(agent.init_train(config.batch_size), make_batch(config))
    data = agent.save()
    other = make_agent(make_config(tmp_path, seed=1))
    obs = make_obs(64, seed=3)

    def actions(which):
        return which.policy(which.init_policy(64), obs)[1]['action']

    mine = actions(agent)
    assert not np.array_equal(actions(other), mine)
    layouts = {k: v.sharding.spec for k, v in other._state.items()}
    other.load(data)
    agent.load(data)  # rewinds the random streams to the saved point
    np.testing.assert_array_equal(actions(other), actions(agent))
    # A resumed run compiles nothing anew: the loaded parameters keep the
    # layout train and report were compiled for, spelled as the compiler
    # spells it (without mesh axes of size 1); the same layout spelled
    # otherwise is another program to XLA's compilation cache.
    assert {k: v.sharding.spec for k, v in other._state.items()} == layouts


def test_load_with_regex_restores_only_matching(agent, config, tmp_path):
    other = make_agent(make_config(tmp_path, seed=2))
    source, before = agent.save(), other.save()
    other.load(source, regex=r'^enc/')
    after = other.save()
    for key in after:
        expected = source[key] if key.startswith('enc/') else before[key]
        np.testing.assert_array_equal(after[key], expected, err_msg=key)
    with pytest.raises(ValueError, match='matches no entry'):
        other.load(source, regex='^nothing/')


@pytest.mark.parametrize('flag, value', [
    ('--agent.dyn.typ', 'transformer'),
    ('--agent.policy_dist_disc', 'onehot'),
    ('--agent.retnorm.impl', 'median'),
    ('--agent.dyn.rssm.act', 'nonsense'),
])
def test_unsupported_config_raises(tmp_path, flag, value):
    from embodied.agents.dreamerv3 import UnsupportedConfig
    config = make_config(tmp_path, flag, value)
    with pytest.raises(UnsupportedConfig, match=flag[2:]):
        make_agent(config)


def test_missing_platform_gives_clear_error(tmp_path):
    from embodied.jax import PlatformError
    config = make_config(tmp_path, '--jax.platform', 'cuda')
    with pytest.raises(PlatformError, match='--jax.platform cpu'):
        make_agent(config)


def test_mock_devices_split_policy_and_train(tmp_path):
    script = textwrap.dedent(f'''
        import sys
        sys.path.insert(0, {ROOT!r})
        sys.path.insert(0, {str(launch.SUPPORT)!r})
        import numpy as np
        import tests.agents.test_dreamerv3 as t
        config = t.make_config({str(tmp_path)!r}, '--jax.mock_devices', '2',
                               '--jax.policy_devices', '0',
                               '--jax.train_devices', '1')
        agent = t.make_agent(config)
        import jax
        policy = {{d for x in jax.tree.leaves(agent._policy_params)
                   for d in x.devices()}}
        train = {{d for x in jax.tree.leaves(agent._state) for d in x.devices()}}
        carry, act, _ = agent.policy(agent.init_policy(2), t.make_obs(2))
        carry = agent.init_train(config.batch_size)
        carry, _, metrics = agent.train(carry, t.make_batch(config))
        train_after = {{d for x in jax.tree.leaves(agent._state)
                        for d in x.devices()}}
        print('DEVICES', sorted(d.id for d in policy), sorted(d.id for d in train),
              sorted(d.id for d in train_after))
    ''')
    env = dict(os.environ, JAX_PLATFORMS='cpu')
    result = subprocess.run(
        [sys.executable, '-c', script], capture_output=True, text=True,
        env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert 'DEVICES [0] [1] [1]' in result.stdout, result.stdout[-2000:]


@pytest.mark.parametrize('script, flags', helpers.SCRIPTS)
def test_runs_under_script_with_debug_config(tmp_path, script, flags):
    """Trains (a loss in the metrics), then a SIGTERM ends the run with a
    save. Under `parallel` the first update waits for train's background
    compile, so the run goes on until it has trained."""
    logdir = tmp_path / 'run'
    code, output = launch.run_until_logged(
        '--configs', 'debug', '--agent_impl', 'dreamerv3',
        '--task', 'cartpole_balance', '--script', script, *flags,
        logdir=logdir, key='train/loss/dyn', logfile=tmp_path / 'run.log')
    assert code == 0, output[-4000:]
    assert 'Traceback' not in output, output[-4000:]
    tags = launch.saved_tags(logdir, 'agent')  # The save at the stop.
    assert tags and tags[-1] > 0, (tags, output[-4000:])


def test_image_and_large_integer_observations_train(tmp_path):
    """One agent (built once: each build compiles its own train program):
    a CNN encoder and image decoder (MSE) for `image`, a continuous action
    head, and an int32 observation with no upper bound (`count`), which
    must not become a one-hot input or a categorical output of 2^31
    classes."""
    # Compiled as called: report, which this test never runs, is not built.
    config = make_config(tmp_path, '--jax.precompile', 'False')
    obs_space = dict(
        OBS_SPACE, image=elements.Space(np.uint8, (32, 32, 3)),
        count=elements.Space(np.int32, (), 0))
    act_space = {'action': elements.Space(np.float32, (2,), -1, 1)}
    agent = make_agent(config, obs_space, act_space)
    assert agent.obs_space['count'].dtype == np.int32
    sizes = {k: v.size for k, v in agent.save().items()}
    assert max(sizes.values()) < 1e6, max(sizes.items(), key=lambda x: x[1])
    B, T = config.batch_size, config.batch_length + config.replay_context
    rng = np.random.default_rng(0)
    batch = make_batch(config)
    batch['image'] = rng.integers(0, 255, (B, T, 32, 32, 3)).astype(np.uint8)
    batch['action'] = rng.uniform(-1, 1, (B, T, 2)).astype(np.float32)
    batch['count'] = np.arange(T, dtype=np.int32)[None].repeat(B, 0) + 10 ** 6
    _, _, metrics = agent.train(agent.init_train(B), batch)
    for key in ('image', 'count'):
        loss = metrics[f'loss/{key}']
        assert np.isfinite(loss) and loss > 0, (key, loss)
    obs = dict(make_obs(2), image=np.zeros((2, 32, 32, 3), np.uint8),
               count=np.full(2, 10 ** 6, np.int32))
    _, act, _ = agent.policy(agent.init_policy(2), obs)
    assert act['action'].shape == (2, 2) and act['action'].dtype == np.float32


RACE = '''
import tempfile, threading, traceback
import tests.agents.test_dreamerv3 as t
config = t.make_config(tempfile.mkdtemp())
for attempt in range({attempts}):
    try:
        agent = t.make_agent(config)
    except Exception:
        print('BUILD FAILED', traceback.format_exc(limit=1), flush=True)
        continue
    barrier, errors = threading.Barrier(2), []
    def actor():
        carry = agent.init_policy(2)
        barrier.wait()
        try:
            agent.policy(carry, t.make_obs(2))
        except Exception as e:
            errors.append(repr(e))
    def learner():
        carry = agent.init_train(config.batch_size)
        report = agent.init_report(config.batch_size)
        barrier.wait()
        try:
            agent.train(carry, t.make_batch(config))
            agent.report(report, t.make_batch(config, config.report_length))
        except Exception as e:
            errors.append(repr(e))
    threads = [threading.Thread(target=f) for f in (actor, learner)]
    [x.start() for x in threads]
    [x.join() for x in threads]
    print('FAILED' if errors else 'OK', errors, flush=True)
'''


def test_fresh_agent_first_policy_and_train_at_once():
    """The actor's first policy and the learner's first train and report,
    released together on a fresh agent, as in the first moments of a
    parallel run: ninjax's name scope is process-wide, so two traces at once
    would corrupt each other (and every later trace in the process, hence a
    process of its own)."""
    attempts = 3
    result = subprocess.run(
        [sys.executable, '-c', RACE.format(attempts=attempts)],
        cwd=ROOT, env=launch.env(), capture_output=True, text=True,
        timeout=600)
    lines = [
        x for x in result.stdout.splitlines()
        if x.startswith(('OK', 'FAILED', 'BUILD'))]
    assert result.returncode == 0, result.stderr[-3000:]
    assert lines == ['OK []'] * attempts, '\n'.join(lines)
