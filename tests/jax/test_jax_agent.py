"""The JAX agent base, on a toy model that compiles in moments."""

import threading

import elements
import jax
import jax.numpy as jnp
import ninjax as nj
import numpy as np
import pytest

import embodied
import embodied.jax

OBS = {
    'x': elements.Space(np.float32, (3,)),
    'is_first': elements.Space(bool),
}
ACT = {'action': elements.Space(np.int32, (), 0, 3)}


class Param(nj.Module):
    """One learned array, created on first use."""

    def __init__(self, shape, random):
        self.shape, self.random = shape, random

    def __call__(self):
        def make():
            if self.random:
                return jax.random.normal(nj.seed(), self.shape)
            return jnp.zeros(self.shape)
        return self.value('kernel', make)


class ToyAgent(embodied.jax.Agent):
    """Logits = x @ w; training regresses w towards the targets in the
    batch. The carry counts policy calls per example."""

    policy_keys = '^w/'

    def __init__(self, obs_space, act_space, config):
        super().__init__(obs_space, act_space, config)
        self.w = Param((3, 3), True, name='w')
        self.b = Param((3,), False, name='other')
        self.step = nj.Variable(jnp.zeros, (), jnp.int32, name='step')

    @property
    def ext_space(self):
        return {'target': elements.Space(np.float32, (3,)),
                'stepid': elements.Space(np.uint8, (20,))}

    def init_policy(self, batch_size):
        return {'count': jnp.zeros((batch_size,), jnp.int32)}

    init_train = init_report = init_policy

    def policy(self, carry, obs, mode='train'):
        logits = obs['x'] @ self.w()
        action = jax.random.categorical(nj.seed(), logits)
        carry = {'count': carry['count'] + 1}
        return carry, {'action': action}, {'logits': logits}

    def train(self, carry, data):
        def loss():
            pred = data['x'] @ self.w() + self.b()
            return jnp.square(pred - data['target']).mean()
        value, params, grads = nj.grad(loss, [self.w, self.b])()
        for module in (self.w, self.b):
            name = module.path + '/kernel'
            module.write('kernel', params[name] - 0.1 * grads[name])
        self.step.write(self.step.read() + 1)
        outs = {'replay': {'stepid': data['stepid']}}
        return {'count': carry['count'] + 1}, outs, {'loss': value}

    def report(self, carry, data):
        return carry, {'mean_x': data['x'].mean()}


def make_config(seed=0, **jaxkw):
    jaxcfg = dict(
        platform='cpu', compute_dtype='auto', policy_devices=[0],
        train_devices=[0], mock_devices=0, prealloc=False, jit=True,
        debug=False, expect_devices=0)
    jaxcfg.update(jaxkw)
    return elements.Config(seed=seed, logdir='', jax=jaxcfg)


def make_batch(B=4, T=5, seed=0):
    rng = np.random.default_rng(seed)
    return {
        'x': rng.normal(size=(B, T, 3)).astype(np.float32),
        'is_first': np.zeros((B, T), bool),
        'action': rng.integers(0, 3, (B, T)).astype(np.int32),
        'target': rng.normal(size=(B, T, 3)).astype(np.float32),
        'stepid': rng.integers(0, 255, (B, T, 20)).astype(np.uint8),
        'log/ignored': np.zeros((B, T), np.float32),
        'name': np.array([['a'] * T] * B),
    }


def make_obs(B=4, seed=0):
    rng = np.random.default_rng(seed)
    return {'x': rng.normal(size=(B, 3)), 'is_first': np.ones(B, bool),
            'envid': np.arange(B)}


@pytest.fixture(scope='module')
def agent():
    return ToyAgent(OBS, ACT, make_config())


def test_runtime_defaults_to_float32_on_cpu_and_caches(agent):
    assert agent.runtime.platform == 'cpu'
    assert agent.runtime.compute_dtype == jnp.float32
    assert agent.runtime.cache_dir
    assert jax.config.jax_compilation_cache_dir == agent.runtime.cache_dir


def test_policy_casts_obs_and_returns_numpy(agent):
    carry = agent.init_policy(4)
    carry, act, out = agent.policy(carry, make_obs())
    assert act['action'].dtype == np.int32 and act['action'].shape == (4,)
    assert isinstance(out['logits'], np.ndarray)
    np.testing.assert_array_equal(np.asarray(carry['count']), 1)
    with pytest.raises(KeyError, match="'is_first' missing"):
        agent.policy(carry, {'x': np.zeros((4, 3))})


def test_policy_list_carries_round_trip(agent):
    islist = lambda x: isinstance(x, list)
    initial = elements.tree.map(
        lambda x: x[0], agent.init_policy(4), isleaf=islist)
    carry = elements.tree.map(lambda *xs: list(xs), *[initial] * 4)
    for _ in range(2):
        carry, _, _ = agent.policy(carry, make_obs())
        assert all(islist(x) for x in jax.tree.leaves(carry, is_leaf=islist))
        parts = [elements.tree.map(lambda x: x[i], carry, isleaf=islist)
                 for i in range(4)]
        carry = elements.tree.map(lambda *xs: list(xs), *parts)
    assert [int(x) for x in carry['count']] == [2, 2, 2, 2]


def test_train_filters_keys_updates_policy_and_returns_numpy(agent):
    before = np.asarray(agent._policy_params['w/kernel'])
    carry = agent.init_train(4)
    carry, outs, metrics = agent.train(carry, make_batch())
    assert isinstance(metrics['loss'], np.ndarray)
    assert isinstance(outs['replay']['stepid'], np.ndarray)
    after = np.asarray(agent._policy_params['w/kernel'])
    assert not np.allclose(before, after)
    assert set(agent._policy_params) == {'w/kernel'}
    carry, metrics = agent.report(agent.init_report(4), make_batch())
    assert 'mean_x' in metrics


def test_compiled_agent_wraps_the_model(agent):
    assert type(agent) is embodied.jax.Agent
    assert isinstance(agent.model, ToyAgent)
    assert set(agent.ext_space) == {'target', 'stepid'}
    with pytest.raises(TypeError, match='subclass'):
        embodied.jax.Agent(OBS, ACT, make_config())


def test_batch_without_an_observation_names_it(agent):
    batch = make_batch()
    del batch['is_first']
    with pytest.raises(KeyError, match='batch lacks is_first'):
        agent.train(agent.init_train(4), batch)


def test_policy_keys_matching_nothing_is_an_error():
    class Unmatched(ToyAgent):
        policy_keys = '^nothing/'
    with pytest.raises(ValueError, match="policy_keys '\\^nothing/'"):
        Unmatched(OBS, ACT, make_config())


def test_stream_is_the_source_and_train_takes_only_model_keys(agent):
    source = iter([make_batch(seed=1)])
    assert agent.stream(source) is source  # Never reads ahead.
    batch = make_batch(seed=1)
    assert 'name' in batch and 'log/ignored' in batch
    carry, _, metrics = agent.train(agent.init_train(len(batch['x'])), batch)
    assert metrics and all(np.isfinite(v).all() for v in metrics.values())


def test_concurrent_policy_and_train(agent):
    errors, stop = [], threading.Event()

    def actor():
        try:
            carry = agent.init_policy(4)
            while not stop.is_set():
                carry, _, _ = agent.policy(carry, make_obs())
        except Exception as e:  # noqa: BLE001 -- reported below
            errors.append(e)

    thread = threading.Thread(target=actor)
    thread.start()
    carry = agent.init_train(4)
    for i in range(200):
        carry, _, _ = agent.train(carry, make_batch(seed=i))
    stop.set()
    thread.join(30)
    assert not errors, errors


def test_save_load_and_regex():
    a = ToyAgent(OBS, ACT, make_config(seed=0))
    b = ToyAgent(OBS, ACT, make_config(seed=1))
    a.train(a.init_train(4), make_batch())
    data = a.save()
    assert {'w/kernel', 'other/kernel', 'step/value', 'rng/policy'} <= set(
        data)
    before = b.save()
    b.load(data, regex='^w/')
    after = b.save()
    np.testing.assert_array_equal(after['w/kernel'], data['w/kernel'])
    np.testing.assert_array_equal(
        after['other/kernel'], before['other/kernel'])
    assert after['step/value'] == before['step/value'] == 0
    b.load(data)
    obs = make_obs(64)
    act_a = a.policy(a.init_policy(64), obs)[1]['action']
    act_b = b.policy(b.init_policy(64), obs)[1]['action']
    np.testing.assert_array_equal(act_a, act_b)
    bad = dict(data, **{'w/kernel': np.zeros((2, 2))})
    with pytest.raises(ValueError, match='w/kernel'):
        b.load(bad)
    with pytest.raises(KeyError, match='lacks'):
        b.load({'w/kernel': data['w/kernel']})


def test_without_jit():
    agent = ToyAgent(OBS, ACT, make_config(jit=False))
    carry, act, _ = agent.policy(agent.init_policy(4), make_obs())
    assert act['action'].shape == (4,)
    agent.train(agent.init_train(4), make_batch())


@pytest.mark.parametrize('key, value, error', [
    ('platform', 'cuda', embodied.jax.PlatformError),
    ('platform', 'quantum', ValueError),
    ('compute_dtype', 'int8', ValueError),
    ('train_devices', [5], embodied.jax.PlatformError),
])
def test_bad_jax_config_gives_clear_error(key, value, error):
    with pytest.raises(error, match=key if key != 'platform' or
                       value == 'quantum' else '--jax.platform cpu'):
        ToyAgent(OBS, ACT, make_config(**{key: value}))


class CountTraces:
    """Counts JAX's traces and backend compiles while in the block (any
    thread of the process)."""

    EVENTS = {
        '/jax/core/compile/jaxpr_trace_duration': 'traces',
        '/jax/core/compile/backend_compile_duration': 'compiles'}

    def __enter__(self):
        self.counts = {'traces': 0, 'compiles': 0}
        jax.monitoring.register_event_duration_secs_listener(self._listen)
        return self.counts

    def __exit__(self, *exc):
        jax.monitoring.unregister_event_duration_listener(self._listen)

    def _listen(self, event, duration, **kwargs):
        if event in self.EVENTS:
            self.counts[self.EVENTS[event]] += 1


def test_compiled_ahead_nothing_traces_for_any_policy_batch_size():
    """Built with the learner's shapes and the actor's batch size, the agent
    serves policy batches of every size up to it, and train and report,
    without tracing or compiling anything more: partial batches are padded
    to the compiled size."""
    size = 5
    config = elements.Config(
        **make_config(), batch_size=4, batch_length=5, report_length=3,
        policy_batches={'train': [size]})
    agent = ToyAgent(OBS, ACT, config)
    built = dict(agent.traces)
    assert built['policy'] >= 1 and built['train'] >= 1, built
    initial = agent.init_policy(size)
    rows = [jax.tree.map(lambda x: x[i], initial) for i in range(size)]
    with CountTraces() as counts:
        for step in range(2):
            for n in range(1, size + 1):
                carry = jax.tree.map(lambda *xs: list(xs), *rows[:n])
                carry, act, out = agent.policy(carry, make_obs(n, seed=n))
                assert act['action'].shape == (n,)
                assert out['logits'].shape == (n, 3)
                assert len(carry['count']) == n
                # Each row's carry went through one more call; padding rows
                # never leak into the rows given.
                for i in range(n):
                    rows[i] = {'count': carry['count'][i]}
        carry, act, _ = agent.policy(initial, make_obs(size))
        assert act['action'].shape == (size,)
        train_carry = agent.init_train(4)
        train_carry, _, _ = agent.train(train_carry, make_batch(B=4, T=5))
        agent.report(agent.init_report(4), make_batch(B=4, T=3))
    assert dict(agent.traces) == built
    assert counts == {'traces': 0, 'compiles': 0}, counts
    # Row i took part in the calls with n > i: 2 * (size - i) of them.
    expected = [2 * (size - i) for i in range(size)]
    assert [int(r['count']) for r in rows] == expected


def test_policy_seeds_unique_across_threads():
    """Policy calls from several threads (run.actor_threads > 1) each draw
    their own seed: the policy stream's count equals the calls made, and a
    save taken meanwhile holds a consistent count."""
    agent = ToyAgent(OBS, ACT, make_config())
    start = agent.save()['rng/policy']
    calls, threads = 50, 4

    def actor():
        carry = agent.init_policy(2)
        for _ in range(calls):
            carry, _, _ = agent.policy(carry, make_obs(2))
            agent.save()

    workers = [threading.Thread(target=actor) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert agent.save()['rng/policy'] == start + calls * threads


def test_thread_contract_names_every_public_method():
    """The thread contract heading embodied/jax/agent.py has a row for every
    public method of the agent base, so a new method must state its threads
    and lock."""
    import inspect
    from embodied.jax import agent as agentlib
    table = agentlib.__doc__.split('Thread contract.')[1]
    rows = set()
    for line in table.splitlines():
        first = line.strip().split('  ')[0]
        rows.update(x.strip() for x in first.split(','))
    public = {
        name for name, value in vars(agentlib.Agent).items()
        if not name.startswith('_') and callable(value)}
    assert public <= rows, sorted(public - rows)
