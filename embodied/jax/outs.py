"""Output distributions of network heads, with the original
`embodied.jax.outs` API.

Every output has `pred()` (point prediction) and `loss(target)` (per entry,
negative log-likelihood unless a subclass says otherwise); distributions add
`sample(seed, shape=())`, `logp(event)`, `prob(event)`, `entropy()` and
`kl(other)`. Values are float32 whatever the compute dtype. `Agg` sums (or
otherwise aggregates) trailing event dims.
"""

import functools

import jax
import jax.numpy as jnp
import jax.scipy.stats

i32 = jnp.int32
f32 = jnp.float32
sg = jax.lax.stop_gradient


class Output:

    def __repr__(self):
        pred = self.pred()
        return f'{type(self).__name__}({pred.dtype}, shape={pred.shape})'

    def pred(self):
        raise NotImplementedError(f'{type(self).__name__}.pred')

    def loss(self, target):
        return -self.logp(sg(target))

    def sample(self, seed, shape=()):
        raise NotImplementedError(f'{type(self).__name__}.sample')

    def logp(self, event):
        raise NotImplementedError(f'{type(self).__name__}.logp')

    def prob(self, event):
        return jnp.exp(self.logp(event))

    def entropy(self):
        raise NotImplementedError(f'{type(self).__name__}.entropy')

    def kl(self, other):
        raise NotImplementedError(f'{type(self).__name__}.kl')


class Agg(Output):
    """Aggregates the last `dims` axes of an output's losses, entropies and
    KLs with `agg` (log-probabilities and probabilities are summed)."""

    def __init__(self, output, dims, agg=jnp.sum):
        self.output = output
        self.axes = [-i for i in range(1, dims + 1)]
        self.agg = agg

    def __repr__(self):
        pred = self.pred()
        return (
            f'{type(self.output).__name__}({pred.dtype}, shape={pred.shape}, '
            f'agg={len(self.axes)})')

    def pred(self):
        return self.output.pred()

    def loss(self, target):
        return self.agg(self.output.loss(target), self.axes)

    def sample(self, seed, shape=()):
        return self.output.sample(seed, shape)

    def logp(self, event):
        return self.output.logp(event).sum(self.axes)

    def prob(self, event):
        return self.output.prob(event).sum(self.axes)

    def entropy(self):
        return self.agg(self.output.entropy(), self.axes)

    def kl(self, other):
        if not isinstance(other, Agg):
            raise TypeError(f'Agg.kl needs another Agg, got {other!r}.')
        return self.agg(self.output.kl(other.output), self.axes)


class Frozen:
    """Wraps an output so that every method's result has no gradient."""

    def __init__(self, output):
        self.output = output

    def __getattr__(self, name):
        if name.startswith('__'):
            raise AttributeError(name)
        try:
            fn = getattr(self.output, name)
        except AttributeError:
            raise ValueError(
                f'{type(self.output).__name__} has no method {name!r}.')
        return functools.partial(self._call_frozen, fn)

    def _call_frozen(self, fn, *args, **kwargs):
        return sg(fn(*args, **kwargs))


class Concat:
    """Joins outputs that each cover a slice of `axis` (split at
    `midpoints`): method arguments are sliced per output and the results
    concatenated back."""

    def __init__(self, outputs, midpoints, axis):
        if len(midpoints) != len(outputs) - 1:
            raise ValueError(
                f'Concat of {len(outputs)} outputs needs {len(outputs) - 1} '
                f'midpoints, got {len(midpoints)}.')
        self.outputs = outputs
        self.midpoints = tuple(midpoints)
        self.axis = axis

    def __getattr__(self, name):
        if name.startswith('__'):
            raise AttributeError(name)
        try:
            fns = [getattr(x, name) for x in self.outputs]
        except AttributeError:
            raise ValueError(f'Not every output of Concat has {name!r}.')
        return functools.partial(self._call_each, fns)

    def _call_each(self, fns, *args, **kwargs):
        bounds = zip((None,) + self.midpoints, self.midpoints + (None,))
        results = []
        for fn, (lo, hi) in zip(fns, bounds):
            index = (slice(None),) * self.axis + (slice(lo, hi),)
            a, kw = jax.tree.map(lambda x: x[index], (args, kwargs))
            results.append(fn(*a, **kw))
        return jax.tree.map(
            lambda *xs: jnp.concatenate(xs, self.axis), *results)


def _check_target(output, target):
    if not jnp.issubdtype(target.dtype, jnp.floating):
        raise TypeError(
            f'{type(output).__name__} loss needs a float target, got '
            f'{target.dtype}.')
    if output.mean.shape != target.shape:
        raise ValueError(
            f'{type(output).__name__} loss: target shape {target.shape} != '
            f'prediction shape {output.mean.shape}.')


class MSE(Output):
    """Squared error against `squash(target)` (e.g. symlog); `pred()` is the
    raw prediction, in squashed space."""

    def __init__(self, mean, squash=None):
        self.mean = f32(mean)
        self.squash = squash or (lambda x: x)

    def pred(self):
        return self.mean

    def loss(self, target):
        _check_target(self, target)
        return jnp.square(self.mean - sg(self.squash(f32(target))))


class Huber(Output):
    """Smooth (Charbonnier) Huber loss sqrt(d^2 + eps^2) - eps."""

    def __init__(self, mean, eps=1.0):
        self.mean = f32(mean)
        self.eps = eps

    def pred(self):
        return self.mean

    def loss(self, target):
        _check_target(self, target)
        dist = self.mean - sg(f32(target))
        return jnp.sqrt(jnp.square(dist) + jnp.square(self.eps)) - self.eps


class Normal(Output):

    def __init__(self, mean, stddev=1.0):
        self.mean = f32(mean)
        self.stddev = jnp.broadcast_to(f32(stddev), self.mean.shape)

    def pred(self):
        return self.mean

    def sample(self, seed, shape=()):
        noise = jax.random.normal(seed, shape + self.mean.shape, f32)
        return noise * self.stddev + self.mean

    def logp(self, event):
        if not jnp.issubdtype(event.dtype, jnp.floating):
            raise TypeError(
                f'Normal.logp needs a float event, got {event.dtype}.')
        return jax.scipy.stats.norm.logpdf(f32(event), self.mean, self.stddev)

    def entropy(self):
        return 0.5 * jnp.log(2 * jnp.pi * jnp.square(self.stddev)) + 0.5

    def kl(self, other):
        if not isinstance(other, Normal):
            raise TypeError(f'Normal.kl needs a Normal, got {other!r}.')
        ratio = jnp.square(self.stddev / other.stddev)
        shift = jnp.square(other.mean - self.mean) / jnp.square(other.stddev)
        return 0.5 * (ratio + shift - 1) + (
            jnp.log(other.stddev) - jnp.log(self.stddev))


class Binary(Output):
    """Bernoulli over a logit; `pred()` is the bool `logit > 0`."""

    def __init__(self, logit):
        self.logit = f32(logit)

    def pred(self):
        return self.logit > 0

    def logp(self, event):
        event = f32(event)
        return (
            event * jax.nn.log_sigmoid(self.logit) +
            (1 - event) * jax.nn.log_sigmoid(-self.logit))

    def sample(self, seed, shape=()):
        return jax.random.bernoulli(
            seed, jax.nn.sigmoid(self.logit), shape + self.logit.shape)


def _mix_uniform(logits, unimix):
    probs = jax.nn.softmax(logits, -1)
    probs = (1 - unimix) * probs + unimix / probs.shape[-1]
    return jnp.log(probs)


class Categorical(Output):
    """Categorical over the last axis of `logits` whose events are integer
    indices; `unimix` mixes in that fraction of the uniform distribution."""

    def __init__(self, logits, unimix=0.0):
        logits = f32(logits)
        self.logits = _mix_uniform(logits, unimix) if unimix else logits

    def pred(self):
        return jnp.argmax(self.logits, -1)

    def sample(self, seed, shape=()):
        return jax.random.categorical(
            seed, self.logits, -1, shape + self.logits.shape[:-1])

    def logp(self, event):
        logprobs = jax.nn.log_softmax(self.logits, -1)
        onehot = jax.nn.one_hot(event, self.logits.shape[-1])
        return (logprobs * onehot).sum(-1)

    def entropy(self):
        logprobs = jax.nn.log_softmax(self.logits, -1)
        return -(jnp.exp(logprobs) * logprobs).sum(-1)

    def kl(self, other):
        logprobs = jax.nn.log_softmax(self.logits, -1)
        logother = jax.nn.log_softmax(other.logits, -1)
        return (jnp.exp(logprobs) * (logprobs - logother)).sum(-1)


class OneHot(Output):
    """Categorical whose events are one-hot vectors. `pred()` and `sample()`
    pass straight-through gradients to the probabilities."""

    def __init__(self, logits, unimix=0.0):
        self.dist = Categorical(logits, unimix)

    def pred(self):
        return self._straight_through(self.dist.pred())

    def sample(self, seed, shape=()):
        return self._straight_through(self.dist.sample(seed, shape))

    def logp(self, event):
        return (jax.nn.log_softmax(self.dist.logits, -1) * event).sum(-1)

    def entropy(self):
        return self.dist.entropy()

    def kl(self, other):
        return self.dist.kl(other.dist)

    def _straight_through(self, index):
        onehot = jax.nn.one_hot(index, self.dist.logits.shape[-1], dtype=f32)
        probs = jax.nn.softmax(self.dist.logits, -1)
        return sg(onehot) + (probs - sg(probs))


class TwoHot(Output):
    """Categorical over fixed, sorted `bins` that regresses a scalar: the
    prediction is the expected bin, the target is spread over its two nearest
    bins (in `squash` space; `unsquash` maps predictions back)."""

    def __init__(self, logits, bins, squash=None, unsquash=None):
        logits = f32(logits)
        if logits.shape[-1] != len(bins):
            raise ValueError(
                f'TwoHot: {logits.shape[-1]} logits for {len(bins)} bins.')
        if bins.dtype != f32:
            raise TypeError(f'TwoHot bins must be float32, got {bins.dtype}.')
        self.logits = logits
        self.probs = jax.nn.softmax(logits)
        self.bins = jnp.array(bins)
        self.squash = squash or (lambda x: x)
        self.unsquash = unsquash or (lambda x: x)

    def pred(self):
        # Summing from both ends towards the middle makes the expectation
        # exactly zero for symmetric bins and probabilities (a left-to-right
        # sum leaves a rounding residue), so fresh reward and value heads
        # predict 0.
        n = self.logits.shape[-1]
        weighted = self.probs * self.bins
        half = n // 2
        lower = weighted[..., :half][..., ::-1]
        upper = weighted[..., n - half:]
        total = (lower + upper).sum(-1)
        if n % 2:
            total = weighted[..., half] + total
        return self.unsquash(total)

    def loss(self, target):
        if target.dtype != f32:
            raise TypeError(
                f'TwoHot loss needs a float32 target, got {target.dtype}.')
        target = sg(self.squash(target))
        n = len(self.bins)
        below = (self.bins <= target[..., None]).astype(i32).sum(-1) - 1
        # The bins are sorted, so the first bin above the target is the next
        # one (one comparison over the bins instead of two).
        above = below + 1
        below = jnp.clip(below, 0, n - 1)
        above = jnp.clip(above, 0, n - 1)
        equal = below == above
        to_below = jnp.where(equal, 1, jnp.abs(self.bins[below] - target))
        to_above = jnp.where(equal, 1, jnp.abs(self.bins[above] - target))
        total = to_below + to_above
        soft = (
            jax.nn.one_hot(below, n) * (to_above / total)[..., None] +
            jax.nn.one_hot(above, n) * (to_below / total)[..., None])
        logprobs = jax.nn.log_softmax(self.logits, -1)
        return -(soft * logprobs).sum(-1)
