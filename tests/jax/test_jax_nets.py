"""embodied.jax.nets: the original's layer API on ninjax, checked against
plain numpy computations of the same layers."""

import elements
import jax
import jax.numpy as jnp
import ninjax as nj
import numpy as np
import pytest

from embodied.jax import nets


# Building an agent in the same process sets the compute dtype from its
# config, so every test pins it (see conftest.py).
pytestmark = pytest.mark.usefixtures('bf16_compute')


def run(fn, *args, state=None, seed=0):
    """Runs the impure `fn` once, creating its state; returns (state, out)."""
    return nj.pure(fn)(state or {}, *args, seed=seed, create=True)


def rand(*shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def test_cast_converts_only_floats_unless_forced():
    tree = {'f': jnp.ones(2, jnp.float32), 'i': jnp.ones(2, jnp.int32)}
    out = nets.cast(tree)
    assert out['f'].dtype == jnp.bfloat16 and out['i'].dtype == jnp.int32
    assert nets.cast(tree, force=True)['i'].dtype == jnp.bfloat16


def test_act_names():
    x = jnp.array([-2.0, -0.5, 0.0, 1.5])
    np.testing.assert_allclose(nets.act('none')(x), x)
    np.testing.assert_allclose(nets.act('relu2')(x), np.maximum(x, 0) ** 2)
    np.testing.assert_allclose(
        nets.act('mish')(x), x * np.tanh(np.log1p(np.exp(x))), rtol=1e-6)
    np.testing.assert_allclose(
        nets.act('silu')(x), x / (1 + np.exp(-x)), rtol=1e-6)
    a, b = jnp.array([1.0, -1.0]), jnp.array([3.0, 4.0])
    np.testing.assert_allclose(
        nets.act('swiglu')(jnp.concatenate([a, b])),
        a / (1 + np.exp(-a)) * b, rtol=1e-6)
    with pytest.raises(ValueError, match="Unknown activation 'nope'"):
        nets.act('nope')


def test_symlog_symexp_are_inverse():
    x = jnp.array([-1e4, -3.0, 0.0, 0.5, 1e6])
    np.testing.assert_allclose(nets.symlog(x), np.sign(x) * np.log1p(np.abs(x)))
    np.testing.assert_allclose(nets.symexp(nets.symlog(x)), x, rtol=1e-5)


def test_where_and_mask_broadcast_over_trailing_dims():
    cond = jnp.array([True, False])
    xs = {'a': jnp.ones((2, 3)), 'b': jnp.full((2,), 5.0)}
    ys = {'a': jnp.zeros((2, 3)), 'b': jnp.full((2,), 7.0)}
    out = nets.where(cond, xs, ys)
    np.testing.assert_array_equal(out['a'], [[1, 1, 1], [0, 0, 0]])
    np.testing.assert_array_equal(out['b'], [5, 7])
    np.testing.assert_array_equal(
        nets.mask(jnp.full((2, 2), 3.0), cond), [[3, 3], [0, 0]])
    with pytest.raises(TypeError, match='bool condition'):
        nets.where(jnp.array([1, 0]), xs, ys)


def test_available_marks_padding_values():
    x = jnp.array([[1.0, -jnp.inf], [2.0, 3.0]])
    np.testing.assert_array_equal(nets.available(x), [[1, 0], [1, 1]])
    np.testing.assert_array_equal(nets.available(x, bdims=1), [False, True])
    i = jnp.array([3, -1, 0])
    np.testing.assert_array_equal(nets.available(i), [True, False, True])
    u = jnp.array([[0, 255]], jnp.uint8)
    np.testing.assert_array_equal(nets.available(u, bdims=1), [True])


def test_initializer_scales_by_fan():
    def fn():
        return {
            'tn': nets.Initializer('trunc_normal', 'in')((400, 300)),
            'n': nets.Initializer('normal', 'out')((400, 300)),
            'u': nets.Initializer('uniform', 'avg')((400, 300)),
            'z': nets.Initializer('zeros')((3, 2)),
        }
    _, out = run(fn)
    np.testing.assert_allclose(out['tn'].std(), np.sqrt(1 / 400), rtol=0.03)
    assert np.abs(out['tn']).max() <= 2 * 1.1368 * np.sqrt(1 / 400) + 1e-6
    np.testing.assert_allclose(out['n'].std(), np.sqrt(1 / 300), rtol=0.03)
    limit = np.sqrt(1 / 350)
    assert -limit <= out['u'].min() < -0.95 * limit
    assert 0.95 * limit < out['u'].max() <= limit
    np.testing.assert_array_equal(out['z'], np.zeros((3, 2)))
    # Conv kernels: the spatial dims multiply both fans.
    assert nets.Initializer.compute_fans((5, 5, 3, 8)) == (75, 200)
    assert nets.init('trunc_normal_out') == nets.Initializer(
        'trunc_normal', 'out', 1.0)
    assert nets.init('normal') == nets.Initializer('normal', 'in', 1.0)
    with pytest.raises(ValueError, match="distribution 'bogus'"):
        nets.init('bogus')


def test_linear_matches_matmul_and_creates_params(f32_compute):
    x = rand(4, 6)
    layer = nets.Linear((2, 3), name='lin')
    state, y = run(lambda x: layer(x), x)
    assert set(state) == {'lin/kernel', 'lin/bias'}
    assert state['lin/kernel'].shape == (6, 6)
    assert state['lin/kernel'].dtype == jnp.float32
    np.testing.assert_array_equal(state['lin/bias'], np.zeros(6))
    expected = (x @ np.asarray(state['lin/kernel'])).reshape(4, 2, 3)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)
    # A second call with the state reuses the parameters.
    state2 = {**state, 'lin/bias': jnp.ones(6)}
    _, y2 = nj.pure(lambda x: layer(x))(state2, x)
    np.testing.assert_allclose(y2, expected + 1, rtol=1e-5, atol=1e-5)


def test_linear_outscale_and_winit():
    layer = nets.Linear(
        5, outscale=0.0, bias=False, winit='normal_out', name='lin')
    state, y = run(lambda x: layer(x), nets.cast(jnp.ones((2, 3))))
    assert set(state) == {'lin/kernel'}
    np.testing.assert_array_equal(state['lin/kernel'], np.zeros((3, 5)))
    assert y.dtype == jnp.bfloat16


def test_layers_reject_inputs_not_in_compute_dtype():
    layer = nets.Linear(3, name='lin')
    with pytest.raises(TypeError, match='Expected input of dtype bfloat16'):
        run(lambda x: layer(x), jnp.ones((2, 3), jnp.float32))


def test_ensure_dtypes_checks_the_gradient_dtype(f32_compute):
    grad = jax.grad(lambda x: nets.ensure_dtypes(x).sum())(jnp.ones(3))
    np.testing.assert_array_equal(grad, np.ones(3))
    bad = lambda x: nets.ensure_dtypes(x, jnp.float32, jnp.bfloat16).sum()
    with pytest.raises(TypeError, match='gradient of dtype bfloat16'):
        jax.grad(bad)(jnp.ones(3))


def test_block_linear_is_block_diagonal(f32_compute):
    x = rand(2, 8)
    layer = nets.BlockLinear(12, 4, name='bl')
    state, y = run(lambda x: layer(x), x)
    kernel = np.asarray(state['bl/kernel'])
    assert kernel.shape == (4, 2, 3)
    dense = np.zeros((8, 12), np.float32)
    for g in range(4):
        dense[2 * g: 2 * g + 2, 3 * g: 3 * g + 3] = kernel[g]
    np.testing.assert_allclose(y, x @ dense, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match='do not split into 5 blocks'):
        nets.BlockLinear(12, 5, name='bad')


def test_conv2d_same_padding_and_stride(f32_compute):
    x = rand(2, 8, 8, 3)
    conv = nets.Conv2D(4, 3, name='conv')
    strided = nets.Conv2D(4, 3, 2, name='strided')
    state, (y, z) = run(lambda x: (conv(x), strided(x)), x)
    assert state['conv/kernel'].shape == (3, 3, 3, 4)
    assert y.shape == (2, 8, 8, 4) and z.shape == (2, 4, 4, 4)
    # Interior pixel against an explicit sum over the 3x3 window.
    kernel = np.asarray(state['conv/kernel'])
    expected = np.einsum('hwi,hwio->o', x[0, 2:5, 3:6], kernel)
    np.testing.assert_allclose(y[0, 3, 4], expected, rtol=1e-4, atol=1e-5)


def test_conv2d_transposed_spreads_inputs_over_a_grid(f32_compute):
    x = rand(1, 3, 3, 1)
    conv = nets.Conv2D(1, 1, 2, transp=True, bias=False, name='up')
    state = {'up/kernel': jnp.ones((1, 1, 1, 1))}
    _, y = nj.pure(lambda x: conv(x))(state, x)
    expected = np.zeros((1, 6, 6, 1), np.float32)
    expected[0, 1::2, 1::2] = x[0]
    np.testing.assert_allclose(y, expected)


def test_conv3d_shapes(f32_compute):
    x = rand(1, 4, 6, 6, 2)
    conv = nets.Conv3D(3, 3, (1, 2, 2), name='c3')
    up = nets.Conv3D(2, 3, 2, transp=True, name='up3')
    state, (y, z) = run(lambda x: (conv(x), up(x)), x)
    assert y.shape == (1, 4, 3, 3, 3)
    assert z.shape == (1, 8, 12, 12, 2)
    assert state['c3/kernel'].shape == (3, 3, 3, 2, 3)


def test_norm_rms_and_layer(f32_compute):
    x = rand(5, 7) * 3 + 1
    rmsnorm = nets.Norm('rms', name='rms')
    layernorm = nets.Norm('layer1em6', name='ln')
    state, (a, b) = run(lambda x: (rmsnorm(x), layernorm(x)), x)
    assert set(state) == {'rms/scale', 'ln/scale', 'ln/shift'}
    expected = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-4)
    np.testing.assert_allclose(a, expected, rtol=1e-5)
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    np.testing.assert_allclose(b, (x - mean) / np.sqrt(var + 1e-6), rtol=1e-4)
    assert layernorm.eps == 1e-6


def test_norm_keeps_the_input_dtype():
    norm = nets.Norm('rms', name='n')
    _, y = run(lambda x: norm(x), nets.cast(jnp.ones((2, 4))))
    assert y.dtype == jnp.bfloat16
    with pytest.raises(ValueError, match="Unknown norm 'batch'"):
        nets.Norm('batch', name='bad')


def test_mlp_layers_and_leading_dims(f32_compute):
    mlp = nets.MLP(2, 8, act='relu', norm='none', name='mlp')
    x = rand(3, 4, 5)
    state, y = run(lambda x: mlp(x), x)
    assert sorted(state) == [
        'mlp/linear0/bias', 'mlp/linear0/kernel',
        'mlp/linear1/bias', 'mlp/linear1/kernel']
    w0, w1 = np.asarray(state['mlp/linear0/kernel']), np.asarray(
        state['mlp/linear1/kernel'])
    expected = np.maximum(np.maximum(x @ w0, 0) @ w1, 0)
    assert y.shape == (3, 4, 8)
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)


def test_embed_looks_up_rows(f32_compute):
    embed = nets.Embed(5, 3, (2,), name='emb')
    total = nets.Embed(5, 3, (2,), combine=True, name='sum')
    idx = jnp.array([[1, 4], [0, 0]])
    state, (y, s) = run(lambda i: (embed(i), total(i)), idx)
    table = np.asarray(state['emb/table'])
    assert table.shape == (2, 5, 3)
    np.testing.assert_allclose(y[0, 1], table[1, 4])
    np.testing.assert_allclose(y[1, 0], table[0, 0])
    t2 = np.asarray(state['sum/table'])
    np.testing.assert_allclose(s[0], t2[0, 1] + t2[1, 4], rtol=1e-6)


def test_dict_concat_one_hot_and_squish():
    spaces = {
        'b_act': elements.Space(np.int32, (), 0, 3),
        'a_vec': elements.Space(np.float32, (2,)),
    }
    xs = {
        'b_act': jnp.array([[2, -1]]),
        'a_vec': jnp.array([[[1.0, -3.0], [0.0, -jnp.inf]]]),
    }
    out = nets.DictConcat(spaces, 1, squish=nets.symlog)(xs)
    assert out.shape == (1, 2, 5) and out.dtype == jnp.bfloat16
    expected = np.array([
        [np.log(2), -np.log(4), 0, 0, 1],
        # Unavailable entries (-1, -inf) become zeros.
        [0, 0, 0, 0, 0]], np.float32)
    np.testing.assert_allclose(
        np.asarray(out, np.float32)[0], expected, rtol=1e-2)
    with pytest.raises(KeyError, match='missing keys'):
        nets.DictConcat(spaces, 1)({'a_vec': xs['a_vec']})


def test_gru_scans_over_time(f32_compute):
    gru = nets.GRU(units=4, name='gru')
    inputs = rand(2, 5, 3)
    resets = jnp.zeros((2, 5), bool).at[:, 3].set(True)
    state, (carry, outs) = run(
        lambda x, r: gru(gru.initial(2), x, r), inputs, resets)
    assert outs.shape == (2, 5, 4) and carry.shape == (2, 4)
    np.testing.assert_allclose(carry, outs[:, -1])
    # A reset at step 3 makes steps 3.. independent of the steps before.
    changed = inputs.copy()
    changed[:, :3] += 10
    _, (carry2, outs2) = nj.pure(
        lambda x, r: gru(gru.initial(2), x, r))(state, changed, resets)
    np.testing.assert_allclose(outs2[:, 3:], outs[:, 3:], rtol=1e-5)
    assert not np.allclose(outs2[:, :3], outs[:, :3])


@pytest.mark.slow
def test_transformer_shapes(f32_compute):
    model = nets.Transformer(units=8, layers=2, heads=2, name='tf')
    x = rand(2, 4, 8)
    mask = jnp.tril(jnp.ones((4, 4), bool))[None].repeat(2, 0)
    state, y = run(lambda x: model(x, mask, training=False), x)
    assert y.shape == (2, 4, 8)
    assert 'tf/layer0/mha/qkv/kernel' in state
    # Causal: the first step does not see later ones.
    changed = x.copy()
    changed[:, 1:] += 1
    _, y2 = nj.pure(lambda x: model(x, mask, training=False))(state, changed)
    np.testing.assert_allclose(y2[:, 0], y[:, 0], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_modules_jit_with_ninjax():
    mlp = nets.MLP(2, 16, name='mlp')
    head = nets.Linear(1, name='out')
    fn = nj.pure(lambda x: head(mlp(x)))
    x = jnp.ones((3, 4))
    state, _ = fn({}, x, seed=0, create=True)
    _, y = jax.jit(fn)(state, x)
    assert y.shape == (3, 1) and y.dtype == jnp.bfloat16
