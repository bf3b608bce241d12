"""embodied.jax heads, Optimizer, the opt transformations, Normalize,
SlowModel and LayerScan, built and run through ninjax."""

import elements
import jax
import jax.numpy as jnp
import ninjax as nj
import numpy as np
import optax
import pytest

import embodied.jax
from embodied.jax import nets, opt


# Building an agent in the same process sets the compute dtype from its
# config, so every test pins it (see conftest.py).
pytestmark = pytest.mark.usefixtures('bf16_compute')


def run(fn, *args, state=None, seed=0, create=True):
    return nj.pure(fn)(state or {}, *args, seed=seed, create=create)


# Heads

def test_mlp_head_twohot_starts_at_zero():
    scalar = elements.Space(np.float32, ())
    head = embodied.jax.MLPHead(
        scalar, output='symexp_twohot', layers=1, units=8, outscale=0.0,
        bins=255, winit='trunc_normal_in', name='rew')
    x = jnp.ones((3, 5, 2, 4))
    def fn(x):
        out = head(x, 2)
        return out.pred(), out.loss(jnp.ones((3, 5)))
    state, (pred, loss) = run(fn, x)
    assert sorted(state) == [
        'rew/head/logits/bias', 'rew/head/logits/kernel',
        'rew/mlp/linear0/bias', 'rew/mlp/linear0/kernel',
        'rew/mlp/norm0/scale']
    assert state['rew/mlp/linear0/kernel'].shape == (8, 8)  # 2x4 flattened
    assert state['rew/head/logits/kernel'].shape == (8, 255)
    np.testing.assert_array_equal(state['rew/head/logits/kernel'], 0)
    np.testing.assert_array_equal(pred, np.zeros((3, 5)))
    assert loss.shape == (3, 5)
    np.testing.assert_allclose(loss, np.full((3, 5), np.log(255)), rtol=1e-2)


def test_mlp_head_binary_and_policy_dict():
    binary = elements.Space(bool, (), 0, 2)
    act_space = {
        'action': elements.Space(np.int32, (), 0, 3),
        'move': elements.Space(np.float32, (2,), -1, 1),
    }
    con = embodied.jax.MLPHead(
        binary, 'binary', layers=1, units=8, name='con')
    pol = embodied.jax.MLPHead(
        act_space, {'action': 'categorical', 'move': 'bounded_normal'},
        layers=2, units=8, minstd=0.1, maxstd=1.0, unimix=0.01,
        outscale=0.01, name='pol')
    x = jnp.ones((4, 6))

    def fn(x):
        c = con(x, 1)
        p = pol(x, 1)
        sample = jax.tree.map(lambda d: d.sample(nj.seed()), p)
        return c.prob(1), c.pred(), sample, p['action'].maxent, p[
            'move'].output.stddev, p['move'].entropy()

    state, (prob, pred, sample, maxent, std, ent) = run(fn, x)
    assert prob.shape == (4,) and pred.dtype == bool
    assert sample['action'].shape == (4,)
    assert sample['action'].dtype == jnp.int32
    assert sample['move'].shape == (4, 2)
    assert state['pol/head/action/logits/kernel'].shape == (8, 3)
    assert state['pol/head/move/mean/kernel'].shape == (8, 2)
    np.testing.assert_allclose(maxent, np.log(3))
    assert ((std >= 0.1) & (std <= 1.0)).all()
    assert ent.shape == (4,)  # summed over the two action dims by Agg


def test_head_onehot_and_errors():
    space = elements.Space(np.int32, (3,), 0, 4)
    head = embodied.jax.Head(space, 'onehot', unimix=0.01, name='oh')
    state, (pred, sample) = run(
        lambda x: (lambda o: (o.pred(), o.sample(nj.seed())))(head(x)),
        nets.cast(jnp.ones((2, 5))))
    assert pred.shape == (2, 3, 4) and sample.shape == (2, 3, 4)
    np.testing.assert_array_equal(np.asarray(sample).sum(-1), np.ones((2, 3)))
    with pytest.raises(ValueError, match="unknown output 'gaussian'"):
        embodied.jax.Head(space, 'gaussian', name='bad')
    mse = embodied.jax.Head(space, 'mse', name='mse')
    with pytest.raises(ValueError, match='needs a continuous space'):
        run(lambda x: mse(x), nets.cast(jnp.ones((2, 5))))


def test_dict_head_with_tuple_spaces():
    head = embodied.jax.DictHead(
        {'a': (2,), 'b': ()}, {'a': 'symlog_mse', 'b': 'huber'}, name='vec')
    _, out = run(lambda x: head(x), nets.cast(jnp.ones((3, 4))))
    assert out['a'].pred().shape == (3, 2) and out['b'].pred().shape == (3,)
    assert out['a'].loss(jnp.ones((3, 2))).shape == (3,)
    with pytest.raises(ValueError, match='same keys'):
        embodied.jax.DictHead({'a': (2,)}, {'b': 'mse'}, name='bad')


# Optimizer and transformations

def test_optimizer_reduces_a_regression_loss(f32_compute, capsys):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype(np.float32)
    y = x @ np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32) + 0.7
    model = nets.Linear(1, name='model')
    chain = optax.chain(
        opt.clip_by_agc(0.3), opt.scale_by_rms(0.999, 1e-20),
        opt.scale_by_momentum(0.9), optax.scale_by_learning_rate(0.03))
    optimizer = embodied.jax.Optimizer(model, chain, name='opt')

    def train(x, y):
        def loss(x, y):
            return jnp.square(model(x) - y).mean()
        return optimizer(loss, x, y)

    state, metrics = run(train, x, y)
    assert 'Optimizer opt has 5 params' in capsys.readouterr().out
    assert 'opt/step/value' in state
    assert any(k.startswith('opt/state/') for k in state)
    first = float(metrics['opt/loss'])
    step = jax.jit(nj.pure(train))
    for i in range(300):
        state, metrics = step(state, x, y, seed=i)
    assert float(metrics['opt/loss']) < 0.01 * first
    assert int(metrics['opt/updates']) == 301
    assert set(metrics) == {
        f'opt/{k}' for k in (
            'loss', 'updates', 'grad_norm', 'grad_rms', 'update_rms',
            'param_rms', 'param_count')}
    assert float(metrics['opt/param_count']) == 5
    np.testing.assert_allclose(
        np.asarray(state['model/kernel'])[:, 0], [1, -2, 0.5, 3], atol=0.05)


def test_optimizer_in_an_init_trace_creates_what_nj_grad_would(
        f32_compute, monkeypatch):
    """In a trace that keeps only what it creates (the agent's init), the
    optimizer skips `nj.grad`'s second pass and backward pass, yet creates
    the same entries with the same values: the loss draws a seed, and a
    module created after the optimizer draws the next one."""
    def init():
        model = nets.Linear(3, name='model')
        later = nets.Linear(2, name='later')
        optimizer = embodied.jax.Optimizer(model, optax.adam(0.1), name='opt')

        def train(x):
            def loss(x):
                noise = jax.random.normal(nj.seed(), x.shape)
                return jnp.square(model(x + noise)).mean(), {'n': noise}
            metrics, _ = optimizer(loss, x, has_aux=True)
            return later(x), metrics

        return nj.pure(train)({}, jnp.ones((4, 5)), seed=0, create=True,
                              modify=True, ignore=True)[0]

    fast = init()
    # nj.grad's (loss, params, grads, aux) as `_create`'s (params, aux).
    monkeypatch.setattr(
        embodied.jax.Optimizer, '_create', lambda self, fn, *a, **k:
        nj.grad(fn, self.modules, has_aux=True)(*a, **k)[1::2])
    full = init()
    assert sorted(fast) == sorted(full)
    assert {'model/kernel', 'later/kernel', 'opt/step/value'} <= set(fast)
    for key in full:
        np.testing.assert_array_equal(
            np.asarray(fast[key]), np.asarray(full[key]), err_msg=key)


def test_optimizer_aux_and_loss_checks(f32_compute):
    model = nets.Linear(1, name='model')
    optimizer = embodied.jax.Optimizer(
        [model], optax.sgd(0.1), summary_depth=1, name='opt')

    def train(x):
        def loss(x):
            out = model(x)
            return jnp.square(out).mean(), {'out': out}
        return optimizer(loss, x, has_aux=True)

    state, (metrics, aux) = run(train, jnp.ones((2, 3)))
    assert aux['out'].shape == (2, 1) and 'opt/grad_norm' in metrics

    def bad(x):
        return optimizer(lambda x: model(x).sum(-1), x)
    with pytest.raises(ValueError, match='float32 scalar'):
        run(bad, jnp.ones((2, 3)), state=state)


def test_clip_by_agc_values():
    params = {'a': jnp.array([3.0, 4.0]), 'z': jnp.zeros(2)}
    transform = opt.clip_by_agc(0.3, pmin=1e-3)
    state = transform.init(params)
    big = {'a': jnp.array([30.0, 40.0]), 'z': jnp.array([1.0, 0.0])}
    out, _ = transform.update(big, state, params)
    # ||a|| = 5, so the update's norm is capped at 1.5; a zero parameter
    # allows 0.3 * pmin.
    np.testing.assert_allclose(out['a'], [0.9, 1.2], rtol=1e-6)
    np.testing.assert_allclose(out['z'], [3e-4, 0.0], rtol=1e-5)
    small = {'a': jnp.array([0.3, 0.4]), 'z': jnp.zeros(2)}
    out, _ = transform.update(small, state, params)
    np.testing.assert_allclose(out['a'], [0.3, 0.4])
    off, _ = opt.clip_by_agc(0.0).update(big, (), params)
    np.testing.assert_array_equal(off['a'], big['a'])


def test_scale_by_rms_debiased():
    u1, u2 = np.array([2.0, -0.5]), np.array([1.0, 1.0])
    transform = opt.scale_by_rms(beta=0.999, eps=1e-8)
    state = transform.init({'p': jnp.zeros(2)})
    out1, state = transform.update({'p': jnp.array(u1)}, state)
    np.testing.assert_allclose(out1['p'], np.sign(u1), rtol=1e-5)
    out2, state = transform.update({'p': jnp.array(u2)}, state)
    nu = 0.999 * 0.001 * u1 ** 2 + 0.001 * u2 ** 2
    expected = u2 / (np.sqrt(nu / (1 - 0.999 ** 2)) + 1e-8)
    np.testing.assert_allclose(out2['p'], expected, rtol=1e-4)
    assert int(state[0]) == 2


@pytest.mark.parametrize('nesterov', [False, True])
def test_scale_by_momentum_debiased(nesterov):
    u1, u2 = np.array([1.0, -2.0]), np.array([3.0, 0.0])
    transform = opt.scale_by_momentum(beta=0.9, nesterov=nesterov)
    state = transform.init({'p': jnp.zeros(2)})
    out1, state = transform.update({'p': jnp.array(u1)}, state)
    out2, state = transform.update({'p': jnp.array(u2)}, state)
    mu1 = 0.1 * u1
    mu2 = 0.9 * mu1 + 0.1 * u2
    if nesterov:
        np.testing.assert_allclose(
            out1['p'], (0.9 * mu1 + 0.1 * u1) / 0.1, rtol=1e-5)
        np.testing.assert_allclose(
            out2['p'], (0.9 * mu2 + 0.1 * u2) / (1 - 0.81), rtol=1e-5)
    else:
        np.testing.assert_allclose(out1['p'], u1, rtol=1e-5)
        np.testing.assert_allclose(out2['p'], mu2 / (1 - 0.81), rtol=1e-5)
    np.testing.assert_allclose(state[1]['p'], mu2, rtol=1e-5)


# Normalize

def test_normalize_percentiles_debiased():
    norm = embodied.jax.Normalize(
        'perc', rate=0.01, limit=1e-8, perclo=5.0, perchi=95.0, name='retnorm')
    x1 = jnp.arange(101, dtype=jnp.float32)
    x2 = x1 + 10
    state, (lo1, scale1) = run(lambda x: norm(x, True), x1)
    np.testing.assert_allclose([lo1, scale1], [5.0, 90.0], rtol=1e-5)
    state, (lo2, scale2) = run(lambda x: norm(x, True), x2, state=state)
    corr = 0.99 * 0.01 + 0.01
    np.testing.assert_allclose(
        lo2, (0.99 * 0.01 * 5 + 0.01 * 15) / corr, rtol=1e-5)
    np.testing.assert_allclose(scale2, 90.0, rtol=1e-5)
    # Reading without an update leaves the statistics as they are.
    state2, (lo3, _) = run(lambda x: norm(x, False), x1 * 100, state=state)
    np.testing.assert_allclose(lo3, lo2)
    assert all(np.array_equal(state[k], state2[k]) for k in state)


def test_normalize_without_debias_and_limit():
    norm = embodied.jax.Normalize(
        'perc', rate=0.01, limit=1.0, debias=False, name='retnorm')
    state, (lo, scale) = run(
        lambda x: norm(x, True), jnp.arange(101, dtype=jnp.float32))
    assert sorted(state) == ['retnorm/hi/value', 'retnorm/lo/value']
    np.testing.assert_allclose(lo, 0.05, rtol=1e-5)
    np.testing.assert_allclose(scale, 1.0)  # 0.9 is raised to the limit


def test_normalize_meanstd_and_none():
    norm = embodied.jax.Normalize('meanstd', name='valnorm')
    _, (mean, std) = run(lambda x: norm(x, True), jnp.array([1.0, 2, 3, 4]))
    np.testing.assert_allclose([mean, std], [2.5, np.sqrt(1.25)], rtol=1e-4)
    none = embodied.jax.Normalize('none', name='advnorm')
    state, stats = run(lambda x: none(x, True), jnp.ones(3))
    assert stats == (0.0, 1.0) and state == {}
    with pytest.raises(ValueError, match="unknown impl 'zscore'"):
        embodied.jax.Normalize('zscore', name='bad')


# SlowModel

def test_slow_model_tracks_its_source(f32_compute):
    source = nets.Linear(2, name='val')
    slow = embodied.jax.SlowModel(
        nets.Linear(2, name='slowval'), source=source, rate=0.25, every=2)
    x = jnp.ones((1, 3))
    state, (a, b) = run(lambda x: (source(x), slow(x)), x)
    np.testing.assert_array_equal(a, b)
    assert sorted(state) == [
        'slowval/bias', 'slowval/kernel', 'val/bias', 'val/kernel']
    p0 = np.asarray(state['val/kernel'])
    p1 = p0 + 1.0
    state = {**state, 'val/kernel': jnp.array(p1)}
    # The first update creates the counter; later ones run jitted.
    state, _ = run(lambda: slow.update(), state=state)
    kernels = [np.asarray(state['slowval/kernel'])]
    update = jax.jit(nj.pure(lambda: slow.update()))
    for _ in range(3):
        state, _ = update(state)
        kernels.append(np.asarray(state['slowval/kernel']))
    # Mixes at counts 0 and 2 only (every=2).
    np.testing.assert_allclose(kernels[0], 0.25 * p1 + 0.75 * p0, rtol=1e-6)
    np.testing.assert_allclose(kernels[1], kernels[0])
    np.testing.assert_allclose(
        kernels[3], p1 + 0.75 ** 2 * (p0 - p1), rtol=1e-5)
    assert int(state['slowval_count/value']) == 4
    np.testing.assert_array_equal(state['val/kernel'], p1)  # source untouched
    with pytest.raises(ValueError, match='rate must be 1 or below 0.5'):
        embodied.jax.SlowModel(
            nets.Linear(2, name='s2'), source=source, rate=0.5)


def test_slow_model_needs_source_params_first():
    source = nets.Linear(2, name='val')
    slow = embodied.jax.SlowModel(
        nets.Linear(2, name='slowval'), source=source)
    with pytest.raises(RuntimeError, match='has no parameters yet'):
        run(lambda x: slow(x), nets.cast(jnp.ones((1, 3))))


# LayerScan

class Block(nj.Module):

    def __call__(self, x, scale):
        return jnp.tanh(self.sub('lin', nets.Linear, 4)(x)) * scale


def test_layer_scan_stacks_params_and_matches_a_loop(f32_compute):
    block = Block(name='blk')
    scan = embodied.jax.LayerScan(block, 3)
    x = jnp.array(np.random.default_rng(0).normal(size=(2, 4)), jnp.float32)
    scales = jnp.array([1.0, 0.5, 2.0])
    state, y = run(lambda x, s: scan(x, s), x, scales)
    assert state['blk/lin/kernel'].shape == (3, 4, 4)
    assert state['blk/lin/bias'].shape == (3, 4)
    h = np.asarray(x)
    for i in range(3):
        w = np.asarray(state['blk/lin/kernel'][i])
        b = np.asarray(state['blk/lin/bias'][i])
        h = np.tanh(h @ w + b) * float(scales[i])
    np.testing.assert_allclose(y, h, rtol=1e-5, atol=1e-6)
    # Layers are initialized independently.
    kernels = np.asarray(state['blk/lin/kernel'])
    assert not np.allclose(kernels[0], kernels[1])
    _, y2 = jax.jit(nj.pure(lambda x, s: scan(x, s)))(state, x, scales)
    np.testing.assert_allclose(y2, y, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_optimizer_scales_float16_losses_and_skips_overflows(monkeypatch):
    monkeypatch.setattr(nets, 'COMPUTE_DTYPE', jnp.float16)
    model = nets.Linear(1, name='model')
    optimizer = embodied.jax.Optimizer(model, optax.sgd(0.1), name='opt')

    def train(x, y):
        def loss(x, y):
            pred = model(nets.cast(x)).astype(jnp.float32)
            return jnp.square(pred - y).mean()
        return optimizer(loss, x, y)

    x, y = jnp.ones((4, 3)), jnp.ones((4, 1))
    state, metrics = run(train, x, y)
    assert float(metrics['opt/grad_scale']) == 1e4
    assert float(metrics['opt/grad_overflow']) == 0
    assert int(metrics['opt/updates']) == 1
    # An infinite loss overflows: the update is skipped, the scale halves.
    before = np.asarray(state['model/kernel'])
    state, metrics = nj.pure(train)(state, x, jnp.full((4, 1), jnp.inf))
    assert float(metrics['opt/grad_overflow']) == 1
    assert float(metrics['opt/grad_scale']) == 5e3
    assert int(metrics['opt/updates']) == 1
    assert np.isnan(float(metrics['opt/grad_norm']))
    np.testing.assert_array_equal(state['model/kernel'], before)
