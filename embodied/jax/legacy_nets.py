"""A minimal parameter-tree layer library.

A layer is a plain object that knows its shapes. `layer.init(key)` returns its
parameters as a nested dict of arrays and `layer(params, x)` applies it, so
models stay pure functions of (params, inputs) that `jax.jit` and `jax.grad`
take as they are. Composite layers keep their children in `self.children` and
get `init` for free.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np

f32 = jnp.float32
sg = jax.lax.stop_gradient

WINITS = ('trunc_normal_in', 'trunc_normal', 'normal_in', 'normal', 'uniform')
NORMS = ('rms', 'layer', 'none')
ACTS = {
    'none': lambda x: x,
    'silu': jax.nn.silu,
    'gelu': jax.nn.gelu,
    'relu': jax.nn.relu,
    'elu': jax.nn.elu,
    'tanh': jnp.tanh,
    'mish': lambda x: x * jnp.tanh(jax.nn.softplus(x)),
}


def symlog(x):
    return jnp.sign(x) * jnp.log1p(jnp.abs(x))


def symexp(x):
    return jnp.sign(x) * jnp.expm1(jnp.abs(x))


def activation(name):
    if name not in ACTS:
        raise ValueError(
            f"Unsupported activation '{name}'; choose one of {', '.join(ACTS)}.")
    return ACTS[name]


def check_winit(winit):
    if winit not in WINITS:
        raise ValueError(
            f"Unsupported winit '{winit}'; choose one of {', '.join(WINITS)}.")


def check_norm(norm):
    if norm not in NORMS:
        raise ValueError(
            f"Unsupported norm '{norm}'; choose one of {', '.join(NORMS)}.")


def init_weight(key, shape, fan_in, fan_out, winit, scale=1.0):
    """Variance-scaling initialisers; `scale=0` gives zeros (output layers
    of the reward and value heads start at zero)."""
    check_winit(winit)
    if scale == 0:
        return jnp.zeros(shape, f32)
    fan = fan_in if winit.endswith('_in') or winit == 'uniform' else (
        (fan_in + fan_out) / 2)
    if winit.startswith('trunc_normal'):
        std = math.sqrt(scale / fan) / 0.87962566103423978
        return std * jax.random.truncated_normal(key, -2, 2, shape, f32)
    if winit.startswith('normal'):
        return math.sqrt(scale / fan) * jax.random.normal(key, shape, f32)
    limit = math.sqrt(3 * scale / fan)
    return jax.random.uniform(key, shape, f32, -limit, limit)


class Module:
    """Base: children in `self.children` (name -> Module) are initialised
    with independent keys."""

    children = {}

    def init(self, key):
        names = sorted(self.children)
        keys = jax.random.split(key, max(1, len(names)))
        return {n: self.children[n].init(k) for n, k in zip(names, keys)}


class Linear(Module):

    def __init__(
            self, din, dout, bias=True, winit='trunc_normal_in', outscale=1.0,
            dtype=f32):
        self.din = din
        self.shape = (dout,) if isinstance(dout, int) else tuple(dout)
        self.dout = math.prod(self.shape)
        self.bias = bias
        self.winit = winit
        self.outscale = outscale
        self.dtype = dtype
        check_winit(winit)

    def init(self, key):
        params = {'kernel': init_weight(
            key, (self.din, self.dout), self.din, self.dout, self.winit,
            self.outscale)}
        if self.bias:
            params['bias'] = jnp.zeros((self.dout,), f32)
        return params

    def __call__(self, params, x):
        x = x.astype(self.dtype) @ params['kernel'].astype(self.dtype)
        if self.bias:
            x = x + params['bias'].astype(self.dtype)
        return x.reshape((*x.shape[:-1], *self.shape))


class BlockLinear(Module):
    """A linear layer made of `blocks` independent blocks (block-diagonal
    kernel): the RSSM's recurrent core at a fraction of the dense cost."""

    def __init__(
            self, din, dout, blocks, bias=True, winit='trunc_normal_in',
            outscale=1.0, dtype=f32):
        if din % blocks or dout % blocks:
            raise ValueError(
                f'BlockLinear: {din} inputs and {dout} outputs must both '
                f'divide into {blocks} blocks.')
        self.din, self.dout, self.blocks = din, dout, blocks
        self.bias = bias
        self.winit = winit
        self.outscale = outscale
        self.dtype = dtype

    def init(self, key):
        g, i, o = self.blocks, self.din // self.blocks, self.dout // self.blocks
        params = {'kernel': init_weight(
            key, (g, i, o), i, o, self.winit, self.outscale)}
        if self.bias:
            params['bias'] = jnp.zeros((self.dout,), f32)
        return params

    def __call__(self, params, x):
        g = self.blocks
        x = x.astype(self.dtype).reshape((*x.shape[:-1], g, -1))
        x = jnp.einsum('...gi,gio->...go', x, params['kernel'].astype(self.dtype))
        x = x.reshape((*x.shape[:-2], self.dout))
        if self.bias:
            x = x + params['bias'].astype(self.dtype)
        return x


class Norm(Module):
    """RMS or layer normalisation over the last axis, computed in float32."""

    def __init__(self, dim, kind='rms', eps=1e-4, dtype=f32):
        check_norm(kind)
        self.dim, self.kind, self.eps, self.dtype = dim, kind, eps, dtype

    def init(self, key):
        if self.kind == 'none':
            return {}
        params = {'scale': jnp.ones((self.dim,), f32)}
        if self.kind == 'layer':
            params['offset'] = jnp.zeros((self.dim,), f32)
        return params

    def __call__(self, params, x):
        if self.kind == 'none':
            return x
        x = x.astype(f32)
        if self.kind == 'rms':
            x = x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + self.eps)
            return (x * params['scale']).astype(self.dtype)
        x = x - x.mean(-1, keepdims=True)
        x = x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + self.eps)
        return (x * params['scale'] + params['offset']).astype(self.dtype)


class Dense(Module):
    """Linear, then norm, then activation: the unit every MLP is made of."""

    def __init__(self, din, dout, act='silu', norm='rms', winit='trunc_normal_in',
                 dtype=f32, blocks=0):
        if blocks:
            linear = BlockLinear(din, dout, blocks, winit=winit, dtype=dtype)
        else:
            linear = Linear(din, dout, winit=winit, dtype=dtype)
        self.children = {'linear': linear, 'norm': Norm(dout, norm, dtype=dtype)}
        self.act = activation(act)
        self.dout = dout

    def __call__(self, params, x):
        x = self.children['linear'](params['linear'], x)
        return self.act(self.children['norm'](params['norm'], x))


class MLP(Module):

    def __init__(self, din, layers, units, act='silu', norm='rms',
                 winit='trunc_normal_in', dtype=f32):
        self.children = {}
        for i in range(layers):
            self.children[f'layer{i}'] = Dense(
                din if i == 0 else units, units, act, norm, winit, dtype)
        self.layers = layers
        self.dout = units if layers else din

    def __call__(self, params, x):
        for i in range(self.layers):
            x = self.children[f'layer{i}'](params[f'layer{i}'], x)
        return x


class Conv2D(Module):
    """A 'SAME'-padded 2D convolution over (..., H, W, C) inputs; `transp`
    makes it a transposed convolution that upsamples by `stride`."""

    def __init__(self, din, depth, kernel, stride=1, transp=False, bias=True,
                 winit='trunc_normal_in', outscale=1.0, dtype=f32):
        self.din, self.depth, self.kernel = din, depth, kernel
        self.stride, self.transp, self.bias = stride, transp, bias
        self.winit, self.outscale, self.dtype = winit, outscale, dtype

    def init(self, key):
        k = self.kernel
        shape = (k, k, self.din, self.depth)
        params = {'kernel': init_weight(
            key, shape, k * k * self.din, k * k * self.depth, self.winit,
            self.outscale)}
        if self.bias:
            params['bias'] = jnp.zeros((self.depth,), f32)
        return params

    def __call__(self, params, x):
        batch = x.shape[:-3]
        x = x.reshape((-1, *x.shape[-3:])).astype(self.dtype)
        kernel = params['kernel'].astype(self.dtype)
        dims = ('NHWC', 'HWIO', 'NHWC')
        if self.transp:
            x = jax.lax.conv_transpose(
                x, kernel, (self.stride, self.stride), 'SAME',
                dimension_numbers=dims)
        else:
            x = jax.lax.conv_general_dilated(
                x, kernel, (self.stride, self.stride), 'SAME',
                dimension_numbers=dims)
        if self.bias:
            x = x + params['bias'].astype(self.dtype)
        return x.reshape((*batch, *x.shape[-3:]))


def flat_size(space):
    """Width of a space once concatenated: one-hot for discrete spaces."""
    if space.discrete:
        return math.prod(space.shape) * int(np.max(space.high))
    return math.prod(space.shape)


def concat_spaces(spaces, values, squish=None):
    """Concatenates a dict of values along the last axis in key order, one-hot
    encoding discrete ones (`squish` transforms continuous ones). The batch
    shape is taken from how many dims each value has beyond its space."""
    parts = []
    for key in sorted(spaces):
        space, x = spaces[key], values[key]
        bshape = x.shape[:x.ndim - len(space.shape)]
        if space.discrete:
            classes = int(np.max(space.high))
            x = jax.nn.one_hot(x, classes, dtype=f32)
        else:
            x = x.astype(f32)
            x = squish(x) if squish else x
        parts.append(x.reshape((*bshape, -1)))
    return jnp.concatenate(parts, -1)
