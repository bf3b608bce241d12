"""Output distributions of network heads.

Each has `pred()` (point prediction), `loss(target)` (per-example negative
log-likelihood or error, event dims summed) and, where it makes sense,
`sample(key)`, `logp(x)`, `entropy()`, `kl(other)`.
"""

import math

import jax
import jax.numpy as jnp

from .legacy_nets import symexp, symlog

f32 = jnp.float32
sg = jax.lax.stop_gradient


def _sum_last(x, dims):
    return x.sum(tuple(range(-dims, 0))) if dims else x


class MSE:

    def __init__(self, mean, transform=None, dims=0):
        """`transform` maps targets into prediction space (symlog)."""
        self.mean = mean.astype(f32)
        self.transform = transform
        self.dims = dims

    def pred(self):
        return symexp(self.mean) if self.transform is symlog else self.mean

    def loss(self, target):
        target = target.astype(f32)
        if self.transform:
            target = self.transform(target)
        return _sum_last(jnp.square(self.mean - sg(target)), self.dims)


class Binary:

    def __init__(self, logit):
        self.logit = logit.astype(f32)

    def prob(self, value=1):
        p = jax.nn.sigmoid(self.logit)
        return p if value else 1 - p

    def pred(self):
        return self.logit > 0

    def sample(self, key):
        return jax.random.bernoulli(key, self.prob())

    def loss(self, target):
        """Cross-entropy; soft targets in [0, 1] are allowed."""
        target = sg(target.astype(f32))
        logp1 = jax.nn.log_sigmoid(self.logit)
        logp0 = jax.nn.log_sigmoid(-self.logit)
        return -(target * logp1 + (1 - target) * logp0)


class TwoHot:
    """A categorical over fixed `bins` whose targets are spread over the two
    nearest bins; with symexp-spaced bins it regresses values of any scale."""

    def __init__(self, logits, bins):
        self.logits = logits.astype(f32)
        self.bins = bins.astype(f32)

    def pred(self):
        probs = jax.nn.softmax(self.logits, -1)
        # Summing both halves separately keeps a symmetric zero prediction
        # exact when the bins are symmetric around zero.
        n = self.bins.shape[0]
        lo = (probs[..., :n // 2] * self.bins[:n // 2]).sum(-1)
        hi = (probs[..., n // 2:] * self.bins[n // 2:]).sum(-1)
        return lo + hi

    def loss(self, target):
        target = sg(target.astype(f32))
        n = self.bins.shape[0]
        above = jnp.clip((self.bins <= target[..., None]).sum(-1), 1, n - 1)
        below = above - 1
        lo, hi = self.bins[below], self.bins[above]
        width = jnp.where(hi == lo, 1.0, hi - lo)
        weight_hi = jnp.clip((target - lo) / width, 0, 1)
        weights = (
            jax.nn.one_hot(below, n) * (1 - weight_hi)[..., None] +
            jax.nn.one_hot(above, n) * weight_hi[..., None])
        return -(weights * jax.nn.log_softmax(self.logits, -1)).sum(-1)


def symexp_bins(count, limit=20.0):
    """`count` bins, symmetric around zero and uniform in symlog space."""
    if count % 2 == 1:
        half = symexp(jnp.linspace(-limit, 0, (count - 1) // 2 + 1, dtype=f32))
        return jnp.concatenate([half, -half[:-1][::-1]], 0)
    half = symexp(jnp.linspace(-limit, 0, count // 2, dtype=f32))
    return jnp.concatenate([half, -half[::-1]], 0)


def _unimix_logits(logits, unimix):
    if not unimix:
        return jax.nn.log_softmax(logits, -1)
    probs = jax.nn.softmax(logits, -1)
    probs = (1 - unimix) * probs + unimix / logits.shape[-1]
    return jnp.log(probs)


class Categorical:
    """Integer-valued categorical over the last axis of `logits`, mixed with
    `unimix` of the uniform distribution. `dims` event dims are summed."""

    def __init__(self, logits, unimix=0.0, dims=0):
        self.logp_all = _unimix_logits(logits.astype(f32), unimix)
        self.dims = dims
        self.minent = 0.0
        events = math.prod(logits.shape[logits.ndim - 1 - dims:-1])
        self.maxent = events * math.log(logits.shape[-1])

    def pred(self):
        return self.logp_all.argmax(-1)

    def sample(self, key):
        return jax.random.categorical(key, self.logp_all, -1)

    def logp(self, x):
        onehot = jax.nn.one_hot(x, self.logp_all.shape[-1])
        return _sum_last((onehot * self.logp_all).sum(-1), self.dims)

    def entropy(self):
        probs = jnp.exp(self.logp_all)
        return _sum_last(-(probs * self.logp_all).sum(-1), self.dims)

    def loss(self, target):
        return -self.logp(target)


class OneHot:
    """A one-hot categorical whose samples pass straight-through gradients;
    the RSSM's stochastic latents (`dims` event dims summed)."""

    def __init__(self, logits, unimix=0.0, dims=1):
        self.logits = logits.astype(f32)
        self.logp_all = _unimix_logits(self.logits, unimix)
        self.dims = dims

    def probs(self):
        return jnp.exp(self.logp_all)

    def pred(self):
        index = self.logp_all.argmax(-1)
        return self._straight_through(jax.nn.one_hot(index, self.logits.shape[-1]))

    def sample(self, key):
        index = jax.random.categorical(key, self.logp_all, -1)
        return self._straight_through(jax.nn.one_hot(index, self.logits.shape[-1]))

    def _straight_through(self, onehot):
        probs = self.probs()
        return onehot + probs - sg(probs)

    def entropy(self):
        return _sum_last(-(self.probs() * self.logp_all).sum(-1), self.dims)

    def kl(self, other):
        kl = (self.probs() * (self.logp_all - other.logp_all)).sum(-1)
        return _sum_last(kl, self.dims)


class Normal:
    """Diagonal normal; `dims` event dims are summed."""

    def __init__(self, mean, std, dims=0):
        self.mean = mean.astype(f32)
        self.std = std.astype(f32)
        self.dims = dims

    def pred(self):
        return self.mean

    def sample(self, key):
        return self.mean + self.std * jax.random.normal(key, self.mean.shape)

    def logp(self, x):
        z = (x - self.mean) / self.std
        logp = -0.5 * z * z - jnp.log(self.std) - 0.5 * jnp.log(2 * jnp.pi)
        return _sum_last(logp, self.dims)

    def entropy(self):
        ent = 0.5 * jnp.log(2 * jnp.pi * jnp.e) + jnp.log(self.std)
        return _sum_last(ent, self.dims)

    def loss(self, target):
        return -self.logp(target)
