"""embodied.jax.outs: losses, predictions and samples against hand-computed
numpy values."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from embodied.jax import heads, outs


def close(actual, expected, rtol=1e-5):
    np.testing.assert_allclose(actual, expected, rtol=rtol)


def log_softmax(x):
    x = np.asarray(x, np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_mse_with_symlog_squash():
    symlog = lambda x: jnp.sign(x) * jnp.log1p(jnp.abs(x))
    out = outs.MSE(jnp.array([0.5, -1.0]), squash=symlog)
    target = jnp.array([3.0, -1.0])
    squashed = np.sign([3, -1]) * np.log1p([3, 1])
    expected = (np.array([0.5, -1.0]) - squashed) ** 2
    np.testing.assert_allclose(out.loss(target), expected, rtol=1e-6)
    np.testing.assert_array_equal(out.pred(), [0.5, -1.0])
    with pytest.raises(ValueError, match='target shape'):
        out.loss(jnp.zeros(3))
    with pytest.raises(TypeError, match='float target'):
        out.loss(jnp.zeros(2, jnp.int32))


def test_mse_stops_the_target_gradient():
    grad = jax.grad(lambda t: outs.MSE(jnp.ones(2)).loss(t).sum())(jnp.zeros(2))
    np.testing.assert_array_equal(grad, np.zeros(2))


def test_huber_is_charbonnier():
    out = outs.Huber(jnp.array([0.0, 3.0]), eps=0.5)
    np.testing.assert_allclose(
        out.loss(jnp.array([0.0, -1.0])),
        [0.0, np.sqrt(16 + 0.25) - 0.5], rtol=1e-6)


def test_binary_logp_and_sample():
    out = outs.Binary(jnp.array([2.0, -1.0]))
    p = 1 / (1 + np.exp(-np.array([2.0, -1.0])))
    close(out.logp(jnp.array([1.0, 0.0])), np.log([p[0], 1 - p[1]]))
    close(out.loss(jnp.array([1.0, 1.0])), -np.log(p))
    np.testing.assert_allclose(out.prob(1), p, rtol=1e-5)
    np.testing.assert_array_equal(out.pred(), [True, False])
    samples = out.sample(jax.random.PRNGKey(0), (4000,))
    assert samples.shape == (4000, 2) and samples.dtype == bool
    np.testing.assert_allclose(samples.mean(0), p, atol=0.03)


def test_categorical_against_numpy():
    logits = np.array([[1.0, 2.0, 0.5], [0.0, 0.0, 3.0]], np.float32)
    other = np.array([[0.0, 1.0, 1.0], [2.0, 0.0, 0.0]], np.float32)
    dist, dist2 = outs.Categorical(logits), outs.Categorical(other)
    lp, lq = log_softmax(logits), log_softmax(other)
    np.testing.assert_array_equal(dist.pred(), [1, 2])
    close(dist.logp(jnp.array([0, 2])), [lp[0, 0], lp[1, 2]])
    close(dist.entropy(), -(np.exp(lp) * lp).sum(-1))
    close(dist.kl(dist2), (np.exp(lp) * (lp - lq)).sum(-1))
    close(dist.loss(jnp.array([1, 1])), -lp[:, 1])
    samples = dist.sample(jax.random.PRNGKey(1), (5000,))
    assert samples.shape == (5000, 2)
    freq = (np.asarray(samples)[:, 0, None] == np.arange(3)).mean(0)
    np.testing.assert_allclose(freq, np.exp(lp[0]), atol=0.03)


def test_categorical_unimix():
    logits = jnp.array([10.0, 0.0, 0.0, 0.0])
    dist = outs.Categorical(logits, unimix=0.2)
    probs = np.exp(log_softmax(np.asarray(logits)))
    expected = 0.8 * probs + 0.2 / 4
    np.testing.assert_allclose(np.exp(dist.logits), expected, rtol=1e-5)


def test_one_hot_sample_with_seed_keyword_and_straight_through():
    logits = jnp.array([[0.0, 1.0, 2.0]] * 2)
    dist = outs.OneHot(logits)
    sample = dist.sample(seed=jax.random.PRNGKey(0))
    assert sample.shape == (2, 3) and sample.dtype == jnp.float32
    np.testing.assert_array_equal(sample.sum(-1), [1, 1])
    assert set(np.unique(np.asarray(sample))) <= {0.0, 1.0}
    many = dist.sample(jax.random.PRNGKey(2), (4000,))
    probs = np.exp(log_softmax(np.asarray(logits)))
    np.testing.assert_allclose(many.mean(0), probs, atol=0.03)
    np.testing.assert_array_equal(dist.pred(), [[0, 0, 1], [0, 0, 1]])
    # Straight through: d sample / d logits equals d probs / d logits.
    weights = jnp.array([1.0, -2.0, 0.5])
    seed = jax.random.PRNGKey(3)
    g1 = jax.grad(
        lambda l: (outs.OneHot(l).sample(seed) * weights).sum())(logits)
    g2 = jax.grad(lambda l: (jax.nn.softmax(l) * weights).sum())(logits)
    np.testing.assert_allclose(g1, g2, rtol=1e-5)
    np.testing.assert_allclose(
        dist.logp(jnp.array([[1.0, 0, 0], [0, 0, 1.0]])),
        [log_softmax(logits[0])[0], log_softmax(logits[1])[2]], rtol=1e-5)


def test_two_hot_target_is_split_between_nearest_bins():
    bins = jnp.array([-2.0, -1.0, 0.0, 1.0, 2.0])
    logits = jnp.array([[0.1, 0.5, -0.3, 1.2, 0.0]] * 4)
    dist = outs.TwoHot(logits, bins)
    lp = log_softmax(np.asarray(logits[0]))
    targets = jnp.array([0.25, -1.0, 5.0, -7.0])
    # 0.25: 0.75 on bin 0.0 and 0.25 on bin 1.0; -1 exactly on its bin;
    # values beyond the ends go fully to the end bins.
    expected = [
        -(0.75 * lp[2] + 0.25 * lp[3]), -lp[1], -lp[4], -lp[0]]
    np.testing.assert_allclose(dist.loss(targets), expected, rtol=1e-5)
    probs = np.exp(lp)
    close(dist.pred()[0], (probs * np.asarray(bins)).sum())
    with pytest.raises(TypeError, match='float32 target'):
        dist.loss(jnp.zeros(4, jnp.int32))


def test_two_hot_with_squash():
    bins = jnp.array([0.0, 1.0, 2.0, 3.0])
    dist = outs.TwoHot(
        jnp.zeros((1, 4)), bins, squash=jnp.log1p, unsquash=jnp.expm1)
    lp = np.log(0.25)
    target = jnp.array([np.e ** 1.5 - 1], jnp.float32)  # squashes to 1.5
    np.testing.assert_allclose(dist.loss(target), [-lp], rtol=1e-5)
    np.testing.assert_allclose(dist.pred(), [np.expm1(1.5)], rtol=1e-5)


@pytest.mark.parametrize('count', [255, 256])
def test_symexp_twohot_bins_predict_zero_at_uniform_logits(count):
    bins = heads.symexp_bins(count)
    assert bins.shape == (count,) and bins.dtype == jnp.float32
    np.testing.assert_allclose(bins[0], -np.expm1(20.0), rtol=1e-6)
    np.testing.assert_array_equal(bins, -bins[::-1])
    # Sorted; an even count has zero twice in the middle, as in the original.
    assert (np.diff(np.asarray(bins)) >= 0).all()
    assert (np.asarray(bins) == 0).sum() == 2 - count % 2
    dist = outs.TwoHot(jnp.zeros((3, count)), bins)
    np.testing.assert_array_equal(dist.pred(), np.zeros(3))
    # A distribution with exactly the two-hot weights of a target predicts
    # the target and has the minimal loss (the weights' own entropy).
    target = 1234.5
    b = np.asarray(bins, np.float64)
    hi = int(np.searchsorted(b, target))
    w_hi = (target - b[hi - 1]) / (b[hi] - b[hi - 1])
    weights = np.zeros(count)
    weights[hi - 1], weights[hi] = 1 - w_hi, w_hi
    logits = np.where(weights > 0, np.log(np.maximum(weights, 1e-30)), -1e9)
    dist = outs.TwoHot(jnp.array(logits[None], jnp.float32), bins)
    np.testing.assert_allclose(dist.pred(), [target], rtol=1e-4)
    entropy = -(weights[weights > 0] * np.log(weights[weights > 0])).sum()
    np.testing.assert_allclose(
        dist.loss(jnp.array([target], jnp.float32)), [entropy], rtol=1e-4)


def test_normal_against_closed_forms():
    mean, std = np.array([0.5, -1.0]), np.array([2.0, 0.5])
    dist = outs.Normal(jnp.array(mean), jnp.array(std))
    other = outs.Normal(jnp.zeros(2), 1.0)
    x = np.array([1.0, 0.0])
    logp = (
        -0.5 * ((x - mean) / std) ** 2 - np.log(std) -
        0.5 * np.log(2 * np.pi))
    np.testing.assert_allclose(dist.logp(jnp.array(x)), logp, rtol=1e-5)
    close(dist.entropy(), 0.5 * np.log(2 * np.pi * np.e * std ** 2))
    kl = np.log(1 / std) + (std ** 2 + mean ** 2) / 2 - 0.5
    np.testing.assert_allclose(dist.kl(other), kl, rtol=1e-5)
    samples = dist.sample(jax.random.PRNGKey(0), (20000,))
    np.testing.assert_allclose(samples.mean(0), mean, atol=0.05)
    np.testing.assert_allclose(samples.std(0), std, rtol=0.03)


def test_agg_sums_event_dims():
    logits = np.random.default_rng(0).normal(size=(2, 3, 4))
    logits = jnp.array(logits, jnp.float32)
    inner = outs.OneHot(logits)
    agg = outs.Agg(inner, 1, jnp.sum)
    other = outs.Agg(outs.OneHot(jnp.zeros((2, 3, 4))), 1)
    close(agg.entropy(), inner.entropy().sum(-1), rtol=1e-6)
    close(agg.kl(other), inner.kl(other.output).sum(-1), rtol=1e-6)
    event = jax.nn.one_hot(jnp.zeros((2, 3), jnp.int32), 4)
    close(agg.logp(event), inner.logp(event).sum(-1), rtol=1e-6)
    assert agg.pred().shape == (2, 3, 4)
    assert agg.sample(jax.random.PRNGKey(0)).shape == (2, 3, 4)
    mse = outs.Agg(outs.MSE(jnp.ones((2, 3, 5))), 2, jnp.mean)
    np.testing.assert_allclose(mse.loss(jnp.zeros((2, 3, 5))), np.ones(2))
    with pytest.raises(TypeError, match='another Agg'):
        agg.kl(other.output)


def test_frozen_and_concat():
    frozen = outs.Frozen(outs.MSE(jnp.ones(2)))
    frozen_loss = lambda m: outs.Frozen(outs.MSE(m)).loss(jnp.zeros(2)).sum()
    grad = jax.grad(frozen_loss)(jnp.ones(2))
    np.testing.assert_array_equal(grad, np.zeros(2))
    np.testing.assert_array_equal(frozen.pred(), [1, 1])
    cat = outs.Concat(
        [outs.MSE(jnp.zeros((1, 2))), outs.MSE(jnp.ones((1, 3)))], [2], 1)
    np.testing.assert_array_equal(
        cat.loss(jnp.full((1, 5), 2.0)), [[4, 4, 1, 1, 1]])
