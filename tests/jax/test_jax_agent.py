"""The JAX agent base, on a toy model that compiles in moments."""

import collections
import os
import pathlib
import subprocess
import sys
import textwrap
import threading
import time
import types

import elements
import jax
import jax.numpy as jnp
import ninjax as nj
import numpy as np
import pytest

import embodied
import embodied.jax
from embodied.jax import runtime as runtimelib

ROOT = pathlib.Path(__file__).resolve().parents[2]

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
    option = 'jax_persistent_cache_enable_xla_caches'
    if option in jax.config.values and option.upper() not in os.environ:
        # The GPU autotuner's results are kept in the cache folder too.
        assert getattr(jax.config, option) == runtimelib.XLA_CACHES


class _Config:
    """A stand-in for `jax.config` with the given options."""

    def __init__(self, **values):
        self.values = dict(values)

    def update(self, name, value):
        self.values[name] = value


@pytest.mark.parametrize('has_option', [True, False])
def test_xla_caches_are_enabled_where_jax_has_the_option(
        monkeypatch, has_option):
    option = 'jax_persistent_cache_enable_xla_caches'
    monkeypatch.delenv(option.upper(), raising=False)
    values = {option: None} if has_option else {}
    fake = types.SimpleNamespace(config=_Config(**values))
    runtimelib._enable_xla_caches(fake)
    if has_option:
        assert fake.config.values == {option: runtimelib.XLA_CACHES}
    else:  # An older JAX: nothing set, no error.
        assert fake.config.values == {}


def test_xla_caches_chosen_in_the_environment_are_kept(monkeypatch):
    option = 'jax_persistent_cache_enable_xla_caches'
    monkeypatch.setenv(option.upper(), 'all')
    fake = types.SimpleNamespace(config=_Config(**{option: 'all'}))
    runtimelib._enable_xla_caches(fake)
    assert fake.config.values == {option: 'all'}


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


def test_train_takes_only_model_keys(agent):
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
    assert agent.wait_compiled(120)
    assert agent._compiler.compiled['report'].wait(120)
    built = dict(agent.traces)
    assert built['policy'] >= 1 and built['train'] >= 1, built
    assert built['report'] >= 1, built
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


def test_policy_acts_while_train_compiles(monkeypatch, capsys):
    """Built with the learner's shapes, the agent returns once the policy
    is compiled: the policy acts while train and report compile in the
    background, and train waits until they are compiled."""
    from embodied.jax import compiling
    release = threading.Event()
    original = compiling.Compiler.learner

    def held(self, config):
        assert release.wait(120)
        return original(self, config)
    monkeypatch.setattr(compiling.Compiler, 'learner', held)
    config = elements.Config(
        **make_config(), batch_size=4, batch_length=5, report_length=3,
        policy_batches={'train': [2]})
    agent = ToyAgent(OBS, ACT, config)
    assert not agent.wait_compiled(0.1)
    carry, act, _ = agent.policy(agent.init_policy(2), make_obs(2))
    assert act['action'].shape == (2,)
    assert agent.traces['train'] == 0
    done = []
    learner = threading.Thread(target=lambda: done.append(
        agent.train(agent.init_train(4), make_batch(B=4, T=5))))
    learner.start()
    learner.join(0.5)
    assert not done  # Waits for the compile.
    release.set()
    learner.join(120)
    assert done and agent.wait_compiled(0)
    assert agent._compiler.compiled['report'].wait(120)
    out = capsys.readouterr().out
    assert 'Agent: compiling the parameters, the policy at batch sizes ' \
        'train [2], then train and report in the background' in out
    assert 'Agent: the policy is compiled' in out
    assert 'Compiled the agent in' in out


def test_a_process_ending_during_the_background_compile_waits_for_it():
    """The agent built on a daemon thread (as the launcher's agent thread
    is), and the process ending while train still compiles: it waits for
    the compile and exits 0, instead of aborting in Python's shutdown."""
    script = textwrap.dedent("""
        import threading, time
        import elements
        from embodied.jax import compiling
        from tests.jax import test_jax_agent as t
        original = compiling.Compiler.learner
        def slow(self, config):
            time.sleep(3)
            return original(self, config)
        compiling.Compiler.learner = slow
        config = elements.Config(
            **t.make_config(), batch_size=4, batch_length=5,
            report_length=3, policy_batches={'train': [2]})
        built = threading.Event()
        def build():
            t.ToyAgent(t.OBS, t.ACT, config)
            built.set()
            time.sleep(600)
        threading.Thread(target=build, daemon=True).start()
        assert built.wait(120)
        print('main ends', flush=True)
    """)
    result = subprocess.run(
        [sys.executable, '-c', script], cwd=ROOT, capture_output=True,
        text=True, timeout=180,
        env={**os.environ, 'JAX_PLATFORMS': 'cpu'})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    out = result.stdout
    assert out.index('main ends') < out.index(
        'Agent: waiting for train and report to finish compiling') < out.index(
        'Compiled the agent in'), out


def test_a_failed_background_compile_fails_the_learner(monkeypatch):
    from embodied.jax import compiling

    def broken(self, config):
        raise MemoryError('out of device memory')
    monkeypatch.setattr(compiling.Compiler, 'learner', broken)
    config = elements.Config(
        **make_config(), batch_size=4, batch_length=5,
        policy_batches={'train': [2]})
    agent = ToyAgent(OBS, ACT, config)
    with pytest.raises(RuntimeError, match='Compiling train failed: '
                       'MemoryError: out of device memory'):
        agent.wait_compiled(60)
    with pytest.raises(RuntimeError, match='Compiling report failed'):
        agent.init_report(4)


def test_replicas_meet_before_a_collective_first_runs(monkeypatch):
    """With several replicas, the first run of train, report or their
    init at new shapes waits at a barrier, after compiling and before
    running: gloo gives up on a replica that joins a new collective more
    than 30 s late (seen when one replica compiled `train` later). Runs at
    shapes already met do not wait."""
    agent = ToyAgent(OBS, ACT, make_config())
    met = []

    def barrier(name, timeout_ms=None):
        met.append((name, collections.Counter(agent.traces), agent._updates))
    monkeypatch.setattr(embodied.jax.distributed, 'started', lambda: True)
    monkeypatch.setattr(embodied.jax.distributed, 'barrier', barrier)
    traces = collections.Counter(agent.traces)

    carry = agent.init_train(4)
    assert len(met) == 1
    assert met[0][1]['init_train'] == traces['init_train'] + 1
    carry, _, _ = agent.train(carry, make_batch(T=5))
    assert len(met) == 2
    name, traced, updates = met[1]
    # Compiled before the barrier, run after it (and not traced again).
    assert traced['train'] == traces['train'] + 1 == agent.traces['train']
    assert updates == 0 and agent._updates == 1
    for _ in range(2):
        carry, _, _ = agent.train(carry, make_batch(T=5))
    agent.init_train(4)
    assert len(met) == 2
    carry, _, _ = agent.train(carry, make_batch(T=6))
    agent.report(agent.init_report(4), make_batch(T=3))
    assert len(met) == 5
    assert len({name for name, _, _ in met}) == 5, met
    assert met[2][2] == 3 and agent._updates == 4


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


def test_stream_moves_batches_to_device_ahead_in_order():
    agent = ToyAgent(OBS, ACT, make_config())
    batches = [make_batch(seed=i) for i in range(3)]
    taken = []

    def source():
        for batch in batches:
            taken.append(True)
            yield batch

    stream = agent.stream(source())
    first = next(stream)
    assert set(first) == {'x', 'is_first', 'action', 'target', 'stepid'}
    assert all(isinstance(v, jax.Array) for v in first.values())
    deadline = time.monotonic() + 30
    while len(taken) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)  # The thread reads ahead without being asked.
    assert len(taken) == 3
    # Every batch arrives once, in order, and the end after them.
    rest = list(stream)
    for got, want in zip([first, *rest], batches):
        np.testing.assert_array_equal(np.asarray(got['x']), want['x'])
    assert len(rest) == 2
    carry = agent.init_train(4)
    for batch in [first, *rest]:
        carry, _, metrics = agent.train(carry, batch)
    assert np.isfinite(metrics['loss'])


def test_stream_blocked_on_the_replay_never_blocks_train():
    agent = ToyAgent(OBS, ACT, make_config())
    release = threading.Event()

    def source():  # A replay whose rate limiter holds the second batch.
        yield make_batch(seed=0)
        release.wait()
        yield make_batch(seed=1)

    stream = agent.stream(source())
    batch = next(stream)
    carry = agent.init_train(4)
    # The read-ahead thread now waits on the source; train, policy, save
    # and report go on.
    carry, _, metrics = agent.train(carry, batch)
    carry, _, metrics = agent.train(carry, make_batch(seed=2))
    agent.policy(agent.init_policy(4), make_obs())
    agent.save()
    agent.report(agent.init_report(4), batch)
    assert np.isfinite(metrics['loss'])
    release.set()
    np.testing.assert_array_equal(
        np.asarray(next(stream)['x']), make_batch(seed=1)['x'])
    stream.close()


def test_train_results_read_late_equal_results_read_at_once():
    now = ToyAgent(OBS, ACT, make_config(seed=3))
    late = ToyAgent(OBS, ACT, make_config(seed=3))
    expected, results = [], []
    carry_now, carry_late = now.init_train(4), late.init_train(4)
    for i in range(5):
        carry_now, outs, mets = now.train(carry_now, make_batch(seed=i))
        expected.append((float(mets['loss']), outs['replay']['stepid']))
        carry_late, outs, mets = late.train(carry_late, make_batch(seed=i))
        assert isinstance(mets, embodied.jax.fetch.Fetched)
        assert 'replay' in outs and 'loss' in mets and list(mets) == ['loss']
        results.append((outs, mets))
    for (loss, stepid), (outs, mets) in zip(expected, results):
        assert float(mets['loss']) == loss
        np.testing.assert_array_equal(outs['replay']['stepid'], stepid)
        assert isinstance(outs.result()['replay']['stepid'], np.ndarray)


def test_policy_acts_with_the_newest_finished_parameters():
    agent = ToyAgent(OBS, ACT, make_config())
    obs, carry = make_obs(), agent.init_policy(4)
    assert agent.policy_lag() == {}
    agent.policy(carry, obs)
    assert agent.policy_lag() == {'policy_lag/mean': 0, 'policy_lag/max': 0}
    train = agent.init_train(4)
    for i in range(3):
        train, _, _ = agent.train(train, make_batch(seed=i))
        jax.block_until_ready(agent._policy_params)
        agent.policy(carry, obs)
        np.testing.assert_array_equal(
            np.asarray(agent._params.acting()['w/kernel']),
            agent.save()['w/kernel'])
    assert agent.policy_lag() == {'policy_lag/mean': 0, 'policy_lag/max': 0}
    assert agent.policy_lag() == {}


class FakeArray:
    """Stands in for a device array whose copy the test finishes."""

    def __init__(self, name):
        self.name, self.done = name, False

    def is_ready(self):
        return self.done


def test_params_handover_swaps_when_ready_and_counts_lag():
    made = []

    def make(name):
        def fn():
            made.append(name)
            return {'w': FakeArray(name)}
        return fn

    params = embodied.jax.handover.PolicyParams({'w': FakeArray('v0')}, 0)
    assert params.offer(make('v1'), 1)
    assert not params.offer(make('v2'), 2)  # v1 is still being copied.
    assert made == ['v1']
    assert params.acting(2)['w'].name == 'v0'  # Never waits for v1.
    params.newest()['w'].done = True
    assert params.acting(3)['w'].name == 'v1'
    assert params.lag() == {'policy_lag/mean': 2, 'policy_lag/max': 2}
    # A finished copy the actor has not taken acts once a newer one comes.
    assert params.offer(make('v4'), 4)
    params.newest()['w'].done = True
    assert params.offer(make('v5'), 5)
    assert params.acting(5)['w'].name == 'v4'
    assert params.acting(6)['w'].name == 'v4'
    assert params.lag() == {'policy_lag/mean': 1.5, 'policy_lag/max': 2}
    params.replace({'w': FakeArray('loaded')}, 6)
    assert params.acting(6)['w'].name == 'loaded'  # Even before it is ready.
    assert params.lag() == {'policy_lag/mean': 0, 'policy_lag/max': 0}


CACHE_SCRIPT = '''
import json, sys
import elements, jax, numpy as np
import embodied.jax
hits = []
jax.monitoring.register_event_listener(
    lambda name, **kw: hits.append(name)
    if name == '/jax/compilation_cache/cache_hits' else None)
runtime = embodied.jax.setup(elements.Config(
    platform='cpu', compute_dtype='auto', policy_devices=[0],
    train_devices=[0], mock_devices=0, prealloc=False, jit=True,
    debug=False, expect_devices=0))
fn = jax.jit(lambda x: (x @ x.T).sum() * 3.5 + 12345.0)
compiled = fn.lower(np.ones((7, 5), np.float32)).compile()  # ahead of time
compiled(np.ones((7, 5), np.float32))
print('RESULT', json.dumps({'hits': len(hits), 'dir': runtime.cache_dir}))
'''


def run_cache_script(cache):
    import json
    import os
    import subprocess
    import sys
    env = dict(os.environ, EMBODIED_JAX_CACHE=cache, JAX_PLATFORMS='cpu')
    result = subprocess.run(
        [sys.executable, '-c', CACHE_SCRIPT], env=env, capture_output=True,
        text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    line = [x for x in result.stdout.splitlines() if x.startswith('RESULT')]
    return json.loads(line[-1].split(' ', 1)[1])


def test_compilation_cache_serves_ahead_of_time_compiles(tmp_path):
    cache = str(tmp_path / 'cache')
    first = run_cache_script(cache)
    assert first['dir'] == cache and any((tmp_path / 'cache').iterdir())
    second = run_cache_script(cache)
    assert second['hits'] > first['hits']  # The relaunch loads, not compiles.
    off = run_cache_script('off')
    assert off == {'hits': 0, 'dir': ''}
