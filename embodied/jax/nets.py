"""Network layers as ninjax modules, with the original `embodied.jax.nets` API.

Modules create their parameters on first call through `self.value(...)` and
are called on inputs only (`Linear(units, name='x')(inputs)`), so a model is
an ordinary Python object whose state ninjax threads through `nj.pure`.

Activations run in `COMPUTE_DTYPE` (bfloat16 unless the agent base sets
another); parameters are stored in float32 and cast at use. Layers check that
their inputs already have the compute dtype: `cast()` inputs first.
"""

import functools
import math
from typing import Callable

import jax
import jax.ad_checkpoint as adc
import jax.numpy as jnp
import ninjax as nj
import numpy as np

# Read at call time, so assigning `nets.COMPUTE_DTYPE` changes every module.
COMPUTE_DTYPE = jnp.bfloat16

# Hook through which a partitioner constrains activations by name: the
# layers with parameters (Linear, BlockLinear, Conv2D, Conv3D) pass their
# output as `LAYER_CALLBACK(output, '<module path>/out')` and use what it
# returns. `sharding.activations()` sets it while the agent traces.
LAYER_CALLBACK = lambda tensor, name: tensor

f32 = jnp.float32


def dims(value, what):
    """A size or shape from a config value or a space's shape as Python ints
    (numpy integers and integral floats such as 1e3 from YAML included), so
    one spelling of a number gives one module and one trace."""
    if isinstance(value, (tuple, list)):
        return tuple(dims(x, what) for x in value)
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f'{what} must be an int, got {value!r}.')
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return int(value)
    raise TypeError(f'{what} must be an int, got {value!r}.')


def cast(xs, force=False):
    """Casts the floating leaves of `xs` (every leaf with `force`) to the
    compute dtype."""
    def fn(x):
        if force or jnp.issubdtype(x.dtype, jnp.floating):
            return x.astype(COMPUTE_DTYPE)
        return x
    return jax.tree.map(fn, xs)


def _mish(x):
    return x * jnp.tanh(jax.nn.softplus(x))


def _relu2(x):
    return jnp.square(jax.nn.relu(x))


def _swiglu(x):
    gate, value = jnp.split(x, 2, -1)
    return jax.nn.silu(gate) * value


_EXTRA_ACTS = {
    'none': lambda x: x, 'mish': _mish, 'relu2': _relu2, 'swiglu': _swiglu}


def act(name):
    """Activation function by name: 'none', 'mish', 'relu2', 'swiglu' or any
    function in `jax.nn` ('silu', 'gelu', 'relu', 'tanh', ...)."""
    if name in _EXTRA_ACTS:
        return _EXTRA_ACTS[name]
    fn = getattr(jax.nn, name, None)
    if not callable(fn):
        raise ValueError(
            f"Unknown activation '{name}': use one of "
            f"{', '.join(_EXTRA_ACTS)} or a function of jax.nn.")
    return fn


def init(name):
    """An initializer from a callable or a name such as 'trunc_normal',
    'normal_out' or 'uniform_avg' (the suffix picks the fan; 'in' if none)."""
    if callable(name):
        return name
    if name.endswith(('_in', '_out', '_avg')):
        dist, fan = name.rsplit('_', 1)
    else:
        dist, fan = name, 'in'
    return Initializer(dist, fan, 1.0)


def dropout(x, prob, training):
    if not prob or not training:
        return x
    keep = jax.random.bernoulli(nj.seed(), 1.0 - prob, x.shape)
    return x * keep / (1.0 - prob)


def symlog(x):
    return jnp.sign(x) * jnp.log1p(jnp.abs(x))


def symexp(x):
    return jnp.sign(x) * jnp.expm1(jnp.abs(x))


def where(condition, xs, ys):
    """Picks from the trees `xs` or `ys` by a boolean `condition` over the
    leading dims of every leaf."""
    if condition.dtype != bool:
        raise TypeError(
            f'where() needs a bool condition, got {condition.dtype}.')

    def fn(x, y):
        if x.shape != y.shape:
            raise ValueError(
                f'where() needs leaves of equal shape, got {x.shape} and '
                f'{y.shape}.')
        cond = condition.reshape(
            condition.shape + (1,) * (x.ndim - condition.ndim))
        return jnp.where(cond, x, y)
    return jax.tree.map(fn, xs, ys)


def mask(xs, mask):
    """Zeros the entries of every leaf of `xs` where `mask` is False."""
    return where(mask, xs, jax.tree.map(jnp.zeros_like, xs))


def available(*trees, bdims=None):
    """Which entries hold data: floats that are not -inf and signed integers
    that are not -1 (unsigned and bool values are always available). With
    `bdims`, an entry is available when all its trailing values are."""
    def leaf_mask(x):
        if jnp.issubdtype(x.dtype, jnp.floating):
            m = x != -jnp.inf
        elif jnp.issubdtype(x.dtype, jnp.signedinteger):
            m = x != -1
        elif jnp.issubdtype(x.dtype, jnp.unsignedinteger) or x.dtype == bool:
            m = jnp.ones(x.shape if bdims is None else x.shape[:bdims], bool)
        else:
            raise NotImplementedError(f'available() for dtype {x.dtype}')
        if bdims is not None:
            m = m.all(tuple(range(bdims, m.ndim)))
        return m

    def fn(*xs):
        return functools.reduce(jnp.logical_and, [leaf_mask(x) for x in xs])
    return jax.tree.map(fn, *trees)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def ensure_dtypes(x, fwd=None, bwd=None):
    """Identity that checks the value has dtype `fwd` and its gradient dtype
    `bwd` (both default to the compute dtype)."""
    _check_dtype(x, fwd, 'input')
    return x


def _check_dtype(x, expected, what):
    expected = expected or COMPUTE_DTYPE
    if x.dtype != expected:
        raise TypeError(
            f'Expected {what} of dtype {jnp.dtype(expected).name} but got '
            f'{x.dtype} (shape {x.shape}); cast inputs with nets.cast().')


def _ensure_dtypes_fwd(x, fwd, bwd):
    _check_dtype(x, fwd, 'input')
    return x, None


def _ensure_dtypes_bwd(fwd, bwd, residual, dx):
    _check_dtype(dx, bwd, 'gradient')
    return (dx,)


ensure_dtypes.defvjp(_ensure_dtypes_fwd, _ensure_dtypes_bwd)


def rms(xs):
    """Root mean square over all entries of all leaves, in float32."""
    leaves = jax.tree.leaves(xs)
    count = sum(x.size for x in leaves)
    sumsq = sum(jnp.square(x.astype(f32)).sum() for x in leaves)
    return jnp.sqrt(sumsq / f32(count))


def rope(x, ts=None, inverse=False, maxlen=4096):
    """Rotary position embedding of (batch, time, heads, dim) queries/keys."""
    B, T, _, D = x.shape
    if ts is None:
        ts = jnp.broadcast_to(jnp.arange(T)[None, :], (B, T))
    if ts.shape != (B, T):
        raise ValueError(f'rope() timesteps {ts.shape} must be {(B, T)}.')
    if inverse:
        ts = -ts
    timescale = maxlen ** ((2.0 / D) * jnp.arange(D // 2))
    angles = (ts[:, :, None] / timescale).astype(x.dtype)[:, :, None, :]
    sin, cos = jnp.sin(angles), jnp.cos(angles)
    x1, x2 = jnp.split(x, 2, -1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


class Initializer:
    """Variance-scaling initializer. `dist` is 'zeros', 'uniform', 'normal',
    'trunc_normal' (unit variance after truncation at two stddevs) or
    'normed'; `fan` is 'in', 'out', 'avg' or 'none'."""

    DISTS = ('zeros', 'uniform', 'normal', 'trunc_normal', 'normed')
    FANS = ('in', 'out', 'avg', 'none')

    def __init__(self, dist='trunc_normal', fan='in', scale=1.0):
        if dist not in self.DISTS:
            raise ValueError(
                f"Unknown initializer distribution '{dist}': use one of "
                f"{', '.join(self.DISTS)}.")
        if fan not in self.FANS:
            raise ValueError(
                f"Unknown initializer fan '{fan}': use one of "
                f"{', '.join(self.FANS)}.")
        self.dist = dist
        self.fan = fan
        self.scale = scale

    def __call__(self, shape, dtype=jnp.float32, fshape=None):
        shape = dims(
            tuple(shape) if isinstance(shape, (tuple, list)) else (shape,),
            'Initializer shape')
        if not all(x > 0 for x in shape):
            raise ValueError(
                f'Initializer needs positive int dims, got {shape}.')
        fanin, fanout = self.compute_fans(shape if fshape is None else fshape)
        fan = {'in': fanin, 'out': fanout, 'avg': (fanin + fanout) / 2,
               'none': 1}[self.fan]
        if self.dist == 'zeros':
            x = jnp.zeros(shape, dtype)
        elif self.dist == 'uniform':
            limit = np.sqrt(1 / fan)
            x = jax.random.uniform(nj.seed(), shape, f32, -limit, limit)
        elif self.dist == 'normal':
            x = jax.random.normal(nj.seed(), shape, f32) * np.sqrt(1 / fan)
        elif self.dist == 'trunc_normal':
            # A normal truncated at +-2 has stddev 0.8796; 1.1368 undoes that.
            x = jax.random.truncated_normal(nj.seed(), -2, 2, shape, f32)
            x = x * (1.1368 * np.sqrt(1 / fan))
        else:  # normed: unit L2 norm along all but the last axis
            x = jax.random.uniform(nj.seed(), shape, f32, -1, 1)
            x = x / jnp.linalg.norm(x.reshape((-1, shape[-1])), 2, 0)
        return (x * self.scale).astype(dtype)

    def __repr__(self):
        return f'Initializer({self.dist}, {self.fan}, {self.scale})'

    def __eq__(self, other):
        return all(
            getattr(self, k) == getattr(other, k, None)
            for k in ('dist', 'fan', 'scale'))

    def __hash__(self):
        return hash((self.dist, self.fan, self.scale))

    @staticmethod
    def compute_fans(shape):
        """(fan_in, fan_out); leading dims of a conv kernel are its space."""
        if len(shape) == 0:
            return (1, 1)
        if len(shape) == 1:
            return (1, shape[0])
        if len(shape) == 2:
            return tuple(shape)
        space = math.prod(shape[:-2])
        return (shape[-2] * space, shape[-1] * space)


class _Scaled:
    """Mixin: the weight initializer scaled by `outscale`."""

    def _scaled_winit(self, *args, **kwargs):
        return init(self.winit)(*args, **kwargs) * self.outscale


class Embed(nj.Module):
    """Lookup table of `classes` embeddings of size `units` for each position
    of an integer input with event shape `shape`; `combine` sums them."""

    einit: str | Callable = Initializer('trunc_normal', 'out')
    combine: bool = False

    def __init__(self, classes, units, shape=()):
        self.classes = classes
        self.units = units
        self.shape = tuple(shape)

    def __call__(self, x):
        nevent = len(self.shape)
        bshape = x.shape[:x.ndim - nevent]
        if x.shape[x.ndim - nevent:] != self.shape:
            raise ValueError(
                f'Embed {self.path} expects event shape {self.shape}, got '
                f'input of shape {x.shape}.')
        N = math.prod(self.shape)
        table = self.value(
            'table', init(self.einit), (*self.shape, self.classes, self.units))
        table = table.reshape((N, self.classes, self.units))
        table = table.astype(COMPUTE_DTYPE)
        out = table[jnp.arange(N), x.reshape((-1, N))]
        if self.combine:
            return out.sum(-2).reshape((*bshape, self.units))
        return out.reshape((*bshape, *self.shape, self.units))


class Linear(_Scaled, nj.Module):
    """Dense layer to `units` outputs; a tuple of units reshapes the output."""

    bias: bool = True
    winit: str | Callable = Initializer('trunc_normal')
    binit: str | Callable = Initializer('zeros')
    outscale: float = 1.0

    def __init__(self, units):
        units = dims(units, 'Linear units')
        self.units = units if isinstance(units, tuple) else (units,)

    def __call__(self, x):
        ensure_dtypes(x)
        size = math.prod(self.units)
        kernel = self.value('kernel', self._scaled_winit, (x.shape[-1], size))
        x = x @ kernel.astype(x.dtype)
        if self.bias:
            x = x + self.value('bias', init(self.binit), size).astype(x.dtype)
        x = LAYER_CALLBACK(x, f'{self.path}/out')
        return x.reshape((*x.shape[:-1], *self.units))


class BlockLinear(_Scaled, nj.Module):
    """Block-diagonal dense layer: the input and the `units` outputs are split
    into `blocks` groups that are connected only within each group."""

    bias: bool = True
    winit: str | Callable = Initializer('trunc_normal')
    binit: str | Callable = Initializer('zeros')
    outscale: float = 1.0

    def __init__(self, units, blocks):
        units = dims(units, 'BlockLinear units')
        blocks = dims(blocks, 'BlockLinear blocks')
        if not (blocks <= units and units % blocks == 0):
            raise ValueError(
                f'BlockLinear: {units} units do not split into {blocks} '
                f'blocks.')
        self.units = units
        self.blocks = blocks

    def __call__(self, x):
        ensure_dtypes(x)
        g, insize = self.blocks, x.shape[-1]
        if insize % g:
            raise ValueError(
                f'BlockLinear {self.path}: {insize} inputs do not split into '
                f'{g} blocks.')
        kernel = self.value(
            'kernel', self._scaled_winit, (g, insize // g, self.units // g))
        x = x.reshape((*x.shape[:-1], g, insize // g))
        x = jnp.einsum('...gi,gio->...go', x, kernel.astype(x.dtype))
        x = x.reshape((*x.shape[:-2], self.units))
        if self.bias:
            x = x + self.value(
                'bias', init(self.binit), self.units).astype(x.dtype)
        return LAYER_CALLBACK(x, f'{self.path}/out')


class Conv2D(_Scaled, nj.Module):
    """2D convolution over NHWC inputs. `transp` upsamples by `stride`
    (fractionally strided: spread the input over a zero grid, then convolve
    with stride 1)."""

    transp: bool = False
    groups: int = 1
    pad: str = 'same'
    bias: bool = True
    winit: str | Callable = Initializer('trunc_normal')
    binit: str | Callable = Initializer('zeros')
    outscale: float = 1.0

    def __init__(self, depth, kernel, stride=1):
        self.depth = dims(depth, 'Conv2D depth')
        kernel = dims(kernel, 'Conv2D kernel')
        self.kernel = kernel if isinstance(kernel, tuple) else (kernel, kernel)
        self.stride = dims(stride, 'Conv2D stride')

    def __call__(self, x):
        ensure_dtypes(x)
        shape = (*self.kernel, x.shape[-1] // self.groups, self.depth)
        kernel = self.value('kernel', self._scaled_winit, shape).astype(x.dtype)
        if self.transp:
            if self.pad != 'same':
                raise ValueError(
                    f"Conv2D {self.path}: transp needs pad='same', got "
                    f"'{self.pad}'.")
            s = self.stride
            x = x.repeat(s, -2).repeat(s, -3)
            keeph = (jnp.arange(x.shape[-3]) - 1) % s == 0
            keepw = (jnp.arange(x.shape[-2]) - 1) % s == 0
            keep = keeph[:, None] & keepw[None, :]
            x = x * keep[:, :, None].astype(x.dtype)
            strides = (1, 1)
        else:
            strides = (self.stride, self.stride)
        x = jax.lax.conv_general_dilated(
            x, kernel, strides, self.pad.upper(),
            feature_group_count=self.groups,
            dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
        if self.bias:
            x = x + self.value(
                'bias', init(self.binit), self.depth).astype(x.dtype)
        return LAYER_CALLBACK(x, f'{self.path}/out')


class Conv3D(nj.Module):
    """3D convolution over NTHWC inputs; `transp` uses a transposed conv."""

    transp: bool = False
    groups: int = 1
    pad: str = 'same'
    bias: bool = True
    winit: str | Callable = Initializer('trunc_normal')
    binit: str | Callable = Initializer('zeros')

    def __init__(self, depth, kernel, stride=1):
        self.depth = dims(depth, 'Conv3D depth')
        triple = lambda v: v if isinstance(v, tuple) else (v,) * 3
        self.kernel = triple(dims(kernel, 'Conv3D kernel'))
        self.stride = triple(dims(stride, 'Conv3D stride'))

    def __call__(self, x):
        ensure_dtypes(x)
        dims = ('NTHWC', 'THWIO', 'NTHWC')
        if self.transp:
            if self.groups != 1:
                raise ValueError(f'Conv3D {self.path}: transp needs groups=1.')
            shape = (*self.kernel, x.shape[-1], self.depth)
            kernel = self.value('kernel', init(self.winit), shape)
            x = jax.lax.conv_transpose(
                x, kernel.astype(x.dtype), self.stride, self.pad.upper(),
                dimension_numbers=dims)
        else:
            shape = (*self.kernel, x.shape[-1] // self.groups, self.depth)
            kernel = self.value('kernel', init(self.winit), shape)
            x = jax.lax.conv_general_dilated(
                x, kernel.astype(x.dtype), self.stride, self.pad.upper(),
                feature_group_count=self.groups, dimension_numbers=dims)
        if self.bias:
            x = x + self.value(
                'bias', init(self.binit), self.depth).astype(x.dtype)
        return LAYER_CALLBACK(x, f'{self.path}/out')


class Norm(nj.Module):
    """Normalization over `axis`, computed in float32: impl 'rms', 'layer' or
    'none'. A suffix such as 'rms1em6' sets eps to 1e-6."""

    axis: tuple = (-1,)
    eps: float = 1e-4
    scale: bool = True
    shift: bool = True

    IMPLS = ('none', 'rms', 'layer')

    def __init__(self, impl):
        if '1em' in impl:
            impl, exponent = impl.split('1em')
            self._fields['eps'] = 10 ** -int(exponent)
        if impl not in self.IMPLS:
            raise ValueError(
                f"Unknown norm '{impl}': use one of {', '.join(self.IMPLS)}.")
        self.impl = impl

    def __call__(self, x):
        ensure_dtypes(x)
        if self.impl == 'none':
            return x
        dtype = x.dtype
        x = jnp.asarray(x, f32)
        axis = tuple(a % x.ndim for a in self.axis)
        shape = [
            x.shape[i] if i in axis else 1 for i in range(min(axis), x.ndim)]
        mean2 = adc.checkpoint_name(
            jnp.square(x).mean(axis, keepdims=True), 'small')
        if self.impl == 'rms':
            x = x * (jax.lax.rsqrt(mean2 + self.eps) * self._scale(shape))
        else:
            mean = x.mean(axis, keepdims=True)
            var = adc.checkpoint_name(
                jnp.maximum(0, mean2 - jnp.square(mean)), 'small')
            scale = jax.lax.rsqrt(var + self.eps) * self._scale(shape)
            x = (x - mean) * scale
            x = x + self._shift(shape)
        return x.astype(dtype)

    def _scale(self, shape):
        if not self.scale:
            return jnp.ones(shape, f32)
        return self.value('scale', jnp.ones, shape, f32)

    def _shift(self, shape):
        if not self.shift:
            return jnp.zeros(shape, f32)
        return self.value('shift', jnp.zeros, shape, f32)


class Attention(nj.Module):
    """Multi-head (optionally grouped-query) self-attention over (B, T, D)
    with rotary positions; `mask` is a (B, Tq, Tk) bool of allowed pairs."""

    heads: int = 8
    kv_heads: int = 0
    dropout: float = 0.0
    rope: bool = True
    qknorm: str = 'none'
    bias: bool = True
    winit: str | Callable = Initializer('trunc_normal')
    binit: str | Callable = Initializer('zeros')
    outscale: float = 1.0

    def __call__(self, x, mask=None, ts=None, training=True):
        kw = dict(bias=self.bias, winit=self.winit, binit=self.binit)
        B, T, D = x.shape
        kvh = self.kv_heads or self.heads
        if self.heads % kvh:
            raise ValueError(
                f'Attention {self.path}: {self.heads} heads are not a '
                f'multiple of {kvh} kv_heads.')
        group = self.heads // kvh
        if group == 1:
            q, k, v = jnp.split(self.sub('qkv', Linear, 3 * D, **kw)(x), 3, -1)
        else:
            q = self.sub('q', Linear, D, **kw)(x)
            k = self.sub('k', Linear, D // group, **kw)(x)
            v = self.sub('v', Linear, D // group, **kw)(x)
        q = q.reshape((B, T, self.heads, -1))
        k = k.reshape((B, T, kvh, -1))
        v = v.reshape((B, T, kvh, -1))
        if self.qknorm != 'none':
            q = self.sub('normq', Norm, self.qknorm)(q)
            k = self.sub('normk', Norm, self.qknorm)(k)
        if self.rope:
            q, k = rope(q, ts), rope(k, ts)
        q = q.reshape((B, T, kvh, group, q.shape[-1]))
        logits = jnp.einsum('bqhgd,bkhd->bhgqk', q, k)
        logits = (logits * (1.0 / np.sqrt(k.shape[-1]))).astype(f32)
        if mask is not None:
            if mask.shape != (B, T, k.shape[1]):
                raise ValueError(
                    f'Attention {self.path}: mask {mask.shape} must be '
                    f'{(B, T, k.shape[1])}.')
            logits = jnp.where(mask[:, None, None], logits, -1e30)
        weights = jax.nn.softmax(logits).astype(x.dtype)
        weights = dropout(weights, self.dropout, training)
        x = jnp.einsum('bhgqk,bkhd->bqhgd', weights, v)
        x = x.reshape((B, T, -1))
        return self.sub('proj', Linear, D, **kw, outscale=self.outscale)(x)


class DictConcat:
    """Concatenates a dict of inputs in key order along the last axis: one-hot
    for discrete spaces, `squish` for continuous ones, unavailable entries
    (see `available`) zeroed. `fdims` trailing dims are kept apart from the
    flattened feature axis (1 flattens the whole event)."""

    def __init__(self, spaces, fdims, squish=lambda x: x):
        if fdims < 1:
            raise ValueError(f'DictConcat needs fdims >= 1, got {fdims}.')
        self.keys = sorted(spaces.keys())
        self.spaces = spaces
        self.fdims = fdims
        self.squish = squish

    def __call__(self, xs):
        missing = [k for k in self.keys if k not in xs]
        if missing:
            raise KeyError(
                f'DictConcat is missing keys {missing}; got {sorted(xs)}.')
        first = self.keys[0]
        bdims = xs[first].ndim - len(self.spaces[first].shape)
        parts = []
        for key in self.keys:
            space, x = self.spaces[key], xs[key]
            if x.shape[bdims:] != space.shape:
                raise ValueError(
                    f"DictConcat key '{key}': shape {x.shape} does not end in "
                    f"the space's {space.shape} after {bdims} batch dims.")
            if space.dtype == np.uint8 and len(space.shape) in (2, 3):
                raise NotImplementedError(
                    f"DictConcat key '{key}': images are not supported.")
            ok = available(x, bdims=bdims)
            x = mask(x, ok)
            if space.discrete:
                classes = np.asarray(space.classes).flatten()
                if not (classes == classes[0]).all():
                    raise ValueError(
                        f"DictConcat key '{key}': all entries need the same "
                        f"number of classes, got {sorted(set(classes))}.")
                x = jax.nn.one_hot(
                    x.astype(jnp.int32), int(classes[0]), dtype=COMPUTE_DTYPE)
            else:
                x = self.squish(x).astype(COMPUTE_DTYPE)
            x = mask(x, ok)
            parts.append(x.reshape((*x.shape[:bdims + self.fdims - 1], -1)))
        return jnp.concatenate(parts, -1)


class DictEmbed(nj.Module):
    """Embeds a dict of inputs into one `units` vector per batch entry as the
    sum of a learned offset and one embedding per key."""

    squish: Callable = lambda x: x
    padone: bool = True
    bias: bool = True
    einit: str | Callable = Initializer('trunc_normal', 'out')
    winit: str | Callable = Initializer('trunc_normal')
    binit: str | Callable = Initializer('zeros')
    impl: str = 'onehot'

    def __init__(self, spaces, units):
        if self.impl not in ('onehot', 'lookup'):
            raise ValueError(
                f"DictEmbed impl must be 'onehot' or 'lookup', got "
                f"'{self.impl}'.")
        self.keys = sorted(spaces.keys())
        self.spaces = spaces
        self.units = units
        self.ekw = dict(einit=self.einit)
        self.lkw = dict(bias=self.bias, winit=self.winit, binit=self.binit)

    def __call__(self, xs, bshape):
        if not isinstance(bshape, tuple):
            raise TypeError(
                f'DictEmbed bshape must be a tuple, got {bshape!r}.')
        missing = [k for k in self.keys if k not in xs]
        if missing:
            raise KeyError(f'DictEmbed is missing keys {missing}.')
        nb = len(bshape)
        offset = self.value('init', self.einit, (self.units,))
        total = jnp.broadcast_to(offset, (*bshape, self.units)).astype(
            COMPUTE_DTYPE)
        for key in self.keys:
            space, x = self.spaces[key], xs[key]
            if x.dtype != space.dtype:
                raise TypeError(
                    f"DictEmbed key '{key}': dtype {x.dtype} does not match "
                    f"space {space}.")
            ok = available(x, bdims=nb)
            x = mask(x, ok)
            if space.discrete:
                if space.dtype == np.uint8 and len(space.shape) in (2, 3):
                    raise NotImplementedError(
                        f"DictEmbed key '{key}': images are not supported.")
                classes = int(np.asarray(space.classes).max())
                if classes > 256:
                    raise ValueError(
                        f"DictEmbed key '{key}': {classes} classes (max 256).")
                if self.impl == 'lookup':
                    x = self.sub(
                        key, Embed, classes, self.units, space.shape,
                        combine=True, **self.ekw)(x)
                else:
                    x = jax.nn.one_hot(x, classes, dtype=COMPUTE_DTYPE)
                    x = x.reshape((*x.shape[:nb], -1))
                    x = self.sub(key, Linear, self.units, **self.lkw)(x)
            else:
                x = self.squish(x).astype(COMPUTE_DTYPE)
                x = x.reshape((*x.shape[:nb], -1))
                x = self.sub(key, Linear, self.units, **self.lkw)(x)
            total = total + mask(x, ok)
        return total


class MLP(nj.Module):
    """`layers` times Linear, Norm and activation; any leading dims."""

    act: str = 'silu'
    norm: str = 'rms'
    bias: bool = True
    winit: str | Callable = Initializer('trunc_normal')
    binit: str | Callable = Initializer('zeros')

    def __init__(self, layers=5, units=1024):
        self.layers = layers
        self.units = units
        self.kw = dict(bias=self.bias, winit=self.winit, binit=self.binit)

    def __call__(self, x):
        bshape = x.shape[:-1]
        x = x.astype(COMPUTE_DTYPE).reshape((-1, x.shape[-1]))
        fn = act(self.act)
        for i in range(self.layers):
            x = self.sub(f'linear{i}', Linear, self.units, **self.kw)(x)
            x = fn(self.sub(f'norm{i}', Norm, self.norm)(x))
        return x.reshape((*bshape, x.shape[-1]))


class Transformer(nj.Module):
    """Pre-norm transformer of `layers` attention and feed-forward blocks."""

    units: int = 1024
    layers: int = 12
    heads: int = 8
    ffup: int = 4
    act: str = 'silu'
    norm: str = 'rms'
    glu: bool = False
    rope: bool = True
    qknorm: str = 'none'
    bias: bool = True
    winit: str | Callable = Initializer('trunc_normal')
    binit: str | Callable = Initializer('zeros')
    outscale: float = 1.0

    def __call__(self, x, mask=None, ts=None, training=True):
        kw = dict(bias=self.bias, winit=self.winit, binit=self.binit)
        akw = dict(
            heads=self.heads, rope=self.rope, qknorm=self.qknorm,
            outscale=self.outscale)
        D = x.shape[-1]
        if D != self.units:
            raise ValueError(
                f'Transformer {self.path}: input width {D} != units '
                f'{self.units}.')
        fn = act(self.act)
        for i in range(self.layers):
            with nj.scope(f'layer{i}'):
                h = self.sub('norm1', Norm, self.norm)(x)
                x = x + self.sub('mha', Attention, **kw, **akw)(
                    h, mask, ts, training)
                h = self.sub('norm2', Norm, self.norm)(x)
                if self.glu:
                    hidden = max(D, int((D * self.ffup * 2 / 3) // 32 * 32))
                    ff1 = self.sub('ff1', Linear, hidden, **kw)
                    ff2 = self.sub('ff2', Linear, hidden, **kw)
                    ff3 = self.sub(
                        'ff3', Linear, D, **kw, outscale=self.outscale)
                    h = ff3(fn(ff1(h)) * ff2(h))
                else:
                    ff1 = self.sub('ff1', Linear, D * self.ffup, **kw)
                    ff2 = self.sub(
                        'ff2', Linear, D, **kw, outscale=self.outscale)
                    h = ff2(fn(ff1(h)))
                x = x + h
        return self.sub('outnorm', Norm, self.norm)(x)


class GRU(nj.Module):
    """Normalized GRU over (batch, time, ...) inputs with per-step resets."""

    units: int = 1024
    bias: bool = True
    winit: str | Callable = Initializer('trunc_normal')
    binit: str | Callable = Initializer('zeros')
    norm: str = 'rms'
    update_bias: float = -1.0

    def initial(self, batch_size):
        return jnp.zeros((batch_size, self.units), COMPUTE_DTYPE)

    def __call__(self, carry, inputs, resets, single=False):
        _check_dtype(carry, None, 'GRU carry')
        _check_dtype(inputs, None, 'GRU inputs')
        if resets.dtype != bool:
            raise TypeError(f'GRU resets must be bool, got {resets.dtype}.')
        if single:
            return self.step(carry, inputs, resets)
        return nj.scan(
            lambda c, xs: self.step(c, *xs), carry, (inputs, resets), axis=1)

    def step(self, carry, inp, reset):
        # Inputs that carry the previous action should be zeroed on resets
        # by the caller; only the carry is reset here.
        kw = dict(bias=self.bias, winit=self.winit, binit=self.binit)
        carry = mask(carry, ~reset)
        x = jnp.concatenate([carry, inp], -1)
        x = self.sub('norm', Norm, self.norm)(x)
        x = self.sub('linear', Linear, 3 * self.units, **kw)(x)
        res, cand, update = jnp.split(x, 3, -1)
        cand = jnp.tanh(jax.nn.sigmoid(res) * cand)
        update = jax.nn.sigmoid(update + self.update_bias)
        carry = update * cand + (1 - update) * carry
        return carry, carry
