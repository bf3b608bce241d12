"""Output heads: a feature tensor to an output distribution (see `outs`),
with the original `embodied.jax.heads` API."""

from typing import Callable

import elements
import jax
import jax.numpy as jnp
import ninjax as nj
import numpy as np

from . import nets
from . import outs

f32 = jnp.float32


class MLPHead(nj.Module):
    """An MLP followed by a `Head` (or a `DictHead` when `space` is a dict).
    Called as `head(x, bdims)`: the first `bdims` axes of `x` are batch axes
    and the rest are flattened into features. `hkw` goes to the heads
    (e.g. `outscale`, `bins`, `minstd`, `maxstd`, `unimix`)."""

    units: int = 1024
    layers: int = 5
    act: str = 'silu'
    norm: str = 'rms'
    bias: bool = True
    winit: str | Callable = nets.Initializer('trunc_normal')
    binit: str | Callable = nets.Initializer('zeros')

    def __init__(self, space, output, **hkw):
        shared = dict(bias=self.bias, winit=self.winit, binit=self.binit)
        self.mlp = nets.MLP(
            self.layers, self.units, act=self.act, norm=self.norm, **shared,
            name='mlp')
        head = DictHead if isinstance(space, dict) else Head
        self.head = head(space, output, **shared, **hkw, name='head')

    def __call__(self, x, bdims):
        bshape = jax.tree.leaves(x)[0].shape[:bdims]
        x = x.reshape((*bshape, -1))
        return self.head(self.mlp(x))


class DictHead(nj.Module):
    """One `Head` per key of `spaces`, with `outputs` naming each head's
    output type (a single space and output are keyed 'output')."""

    def __init__(self, spaces, outputs, **kw):
        if not spaces:
            raise ValueError('DictHead needs at least one space.')
        if not isinstance(spaces, dict):
            spaces = {'output': spaces}
        if not isinstance(outputs, dict):
            outputs = {'output': outputs}
        if spaces.keys() != outputs.keys():
            raise ValueError(
                f'DictHead spaces {sorted(spaces)} and outputs '
                f'{sorted(outputs)} must have the same keys.')
        self.spaces = spaces
        self.outputs = outputs
        self.kw = kw

    def __call__(self, x):
        return {
            key: self.sub(key, Head, self.spaces[key], impl, **self.kw)(x)
            for key, impl in self.outputs.items()}


def symexp_bins(count):
    """`count` float32 bins, symmetric around zero and evenly spaced in
    symlog space over [-20, 20]; odd counts include zero."""
    if count % 2 == 1:
        half = jnp.linspace(-20, 0, (count - 1) // 2 + 1, dtype=f32)
        half = nets.symexp(half)
        return jnp.concatenate([half, -half[:-1][::-1]], 0)
    half = nets.symexp(jnp.linspace(-20, 0, count // 2, dtype=f32))
    return jnp.concatenate([half, -half[::-1]], 0)


class Head(nj.Module):
    """A linear layer to the parameters of one output distribution for a
    space. `output` names the distribution: one of `Head.OUTPUTS`. Event dims
    of the space are aggregated with `outs.Agg`."""

    minstd: float = 1.0
    maxstd: float = 1.0
    unimix: float = 0.0
    bins: int = 255
    outscale: float = 1.0

    OUTPUTS = (
        'binary', 'categorical', 'onehot', 'mse', 'huber', 'symlog_mse',
        'symexp_twohot', 'bounded_normal', 'normal_logstd')

    def __init__(self, space, output, **kw):
        if output not in self.OUTPUTS:
            raise ValueError(
                f"Head {self.path}: unknown output '{output}'; use one of "
                f"{', '.join(self.OUTPUTS)}.")
        if isinstance(space, tuple):
            space = elements.Space(np.float32, space)
        if output == 'onehot':
            classes = _uniform_classes(space, self.path)
            space = elements.Space(f32, (*space.shape, classes), 0.0, 1.0)
        self.space = space
        self.impl = output
        self.kw = {**kw, 'outscale': self.outscale}

    def __call__(self, x):
        x = nets.ensure_dtypes(x)
        output = getattr(self, self.impl)(x)
        if self.space.shape:
            output = outs.Agg(output, len(self.space.shape), jnp.sum)
        shape = output.pred().shape[x.ndim - 1:]
        if shape != self.space.shape:
            raise ValueError(
                f'Head {self.path} ({self.impl}) predicts event shape {shape} '
                f'for space {self.space} from input {x.shape}.')
        return output

    def _linear(self, name, shape, x):
        return self.sub(name, nets.Linear, shape, **self.kw)(x)

    def _continuous(self):
        if self.space.discrete:
            raise ValueError(
                f"Head {self.path}: output '{self.impl}' needs a continuous "
                f"space, got {self.space}.")

    def binary(self, x):
        if not np.all(np.asarray(self.space.classes) == 2):
            raise ValueError(
                f"Head {self.path}: 'binary' needs a two-class space, got "
                f"{self.space}.")
        return outs.Binary(self._linear('logit', self.space.shape, x))

    def categorical(self, x):
        if not self.space.discrete:
            raise ValueError(
                f"Head {self.path}: 'categorical' needs a discrete space, got "
                f"{self.space}.")
        classes = _uniform_classes(self.space, self.path)
        logits = self._linear('logits', (*self.space.shape, classes), x)
        output = outs.Categorical(logits)
        output.minent = 0
        output.maxent = np.log(classes)
        return output

    def onehot(self, x):
        self._continuous()
        logits = self._linear('logits', self.space.shape, x)
        return outs.OneHot(logits, self.unimix)

    def mse(self, x):
        self._continuous()
        return outs.MSE(self._linear('pred', self.space.shape, x))

    def huber(self, x):
        self._continuous()
        return outs.Huber(self._linear('pred', self.space.shape, x))

    def symlog_mse(self, x):
        self._continuous()
        return outs.MSE(self._linear('pred', self.space.shape, x), nets.symlog)

    def symexp_twohot(self, x):
        self._continuous()
        logits = self._linear('logits', (*self.space.shape, self.bins), x)
        return outs.TwoHot(logits, symexp_bins(self.bins))

    def bounded_normal(self, x):
        self._continuous()
        mean = self._linear('mean', self.space.shape, x)
        stddev = self._linear('stddev', self.space.shape, x)
        lo, hi = self.minstd, self.maxstd
        stddev = (hi - lo) * jax.nn.sigmoid(stddev + 2.0) + lo
        output = outs.Normal(jnp.tanh(mean), stddev)
        zeros = jnp.zeros_like(mean)
        output.minent = outs.Normal(zeros, self.minstd).entropy()
        output.maxent = outs.Normal(zeros, self.maxstd).entropy()
        return output

    def normal_logstd(self, x):
        self._continuous()
        mean = self._linear('mean', self.space.shape, x)
        stddev = self._linear('stddev', self.space.shape, x)
        return outs.Normal(mean, jnp.exp(stddev))


def _uniform_classes(space, where):
    classes = np.asarray(space.classes).flatten()
    if not (classes == classes[0]).all():
        raise ValueError(
            f'Head {where}: every entry of {space} needs the same number of '
            f'classes, got {sorted(set(classes.tolist()))}.')
    return classes[0].item()
