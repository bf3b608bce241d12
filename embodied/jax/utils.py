"""Stateful helpers of the original `embodied.jax` API: running statistics
for return normalization, a slowly tracking copy of a module, and a layer scan
that runs one module's parameters stacked along a leading axis; and
`get_data_axes`, the mesh axes that modules average statistics over (the
original keeps it in `embodied.jax.internal`)."""

import functools

import jax
import jax.numpy as jnp
import ninjax as nj

sg = jax.lax.stop_gradient
f32 = jnp.float32
i32 = jnp.int32


def get_data_axes():
    """The named data-parallel mesh axes ('d', 'f') when called inside a
    mapped computation that defines them, else (): modules average their
    statistics over these axes."""
    axes = ('d', 'f')
    for axis in axes:
        try:
            jax.lax.axis_index(axis)
        except NameError:
            return ()
    return axes


class Normalize(nj.Module):
    """Exponential moving statistics of a tensor, as (offset, scale).

    impl 'none' gives (0, 1); 'meanstd' the mean and standard deviation;
    'perc' the `perclo` percentile and the distance to the `perchi`
    percentile. Scales are at least `limit`. With `debias`, the averages are
    divided by the weight the updates have accumulated so far (as Adam does),
    so early statistics are not pulled towards zero."""

    rate: float = 0.01
    limit: float = 1e-8
    perclo: float = 5.0
    perchi: float = 95.0
    debias: bool = True

    IMPLS = ('none', 'meanstd', 'perc')

    def __init__(self, impl):
        if impl not in self.IMPLS:
            raise ValueError(
                f"Normalize {self.path}: unknown impl '{impl}'; use one of "
                f"{', '.join(self.IMPLS)}.")
        self.impl = impl
        scalar = lambda name: nj.Variable(jnp.zeros, (), f32, name=name)
        if self.debias and impl != 'none':
            self.corr = scalar('corr')
        if impl == 'meanstd':
            self.mean = scalar('mean')
            self.sqrs = scalar('sqrs')
        elif impl == 'perc':
            self.lo = scalar('lo')
            self.hi = scalar('hi')

    def __call__(self, x, update):
        """Updates the statistics with `x` if `update`; returns the stats."""
        if update:
            self.update(x)
        return self.stats()

    def update(self, x):
        x = sg(f32(x))
        if self.impl == 'meanstd':
            self._ema(self.mean, self._mean(x))
            self._ema(self.sqrs, self._mean(jnp.square(x)))
        elif self.impl == 'perc':
            self._ema(self.lo, self._perc(x, self.perclo))
            self._ema(self.hi, self._perc(x, self.perchi))
        if self.debias and self.impl != 'none':
            self._ema(self.corr, 1.0)

    def stats(self):
        if self.impl == 'none':
            return 0.0, 1.0
        corr = 1.0
        if self.debias:
            corr = 1.0 / jnp.maximum(self.rate, self.corr.read())
        if self.impl == 'meanstd':
            mean = self.mean.read() * corr
            var = jax.nn.relu(self.sqrs.read() * corr - jnp.square(mean))
            return mean, jnp.maximum(self.limit, jnp.sqrt(var))
        lo, hi = self.lo.read() * corr, self.hi.read() * corr
        return sg(lo), sg(jnp.maximum(self.limit, hi - lo))

    def _mean(self, x):
        x = x.mean()
        axes = get_data_axes()
        return jax.lax.pmean(x, axes) if axes else x

    def _perc(self, x, q):
        axes = get_data_axes()
        if axes:
            x = jax.lax.all_gather(x, axes)
        return jnp.percentile(x, q)

    def _ema(self, var, x):
        var.write((1 - self.rate) * var.read() + self.rate * sg(x))


class SlowModel:
    """A copy of the module `source` whose parameters follow the source's as
    a moving average: every `every`-th `update()` mixes in `rate` of the
    source (rate 1 copies). Calls and attributes go to the wrapped `model`,
    a module of the same structure; its parameters start as the source's."""

    def __init__(self, model, *, source, rate=1.0, every=1):
        if not (rate == 1 or rate < 0.5):
            raise ValueError(
                f'SlowModel rate must be 1 or below 0.5, got {rate}.')
        self.source = source
        self.model = model
        self.rate = rate
        self.every = every
        self.count = nj.Variable(
            jnp.zeros, (), i32, name=self.model.path + '_count')

    def __getattr__(self, name):
        if name in ('source', 'model', 'rate', 'every', 'count'):
            raise AttributeError(name)  # not yet set during construction
        self._initonce()
        return getattr(self.model, name)

    def __call__(self, *args, **kwargs):
        self._initonce()
        return self.model(*args, **kwargs)

    def update(self):
        self._initonce()
        count = self.count.read()
        mix = jnp.where(count % self.every == 0, self.rate, 0)
        src, dst = self.source.values, self.model.values
        for key in dst:
            self.model.write(key, mix * src[key] + (1 - mix) * dst[key])
        self.count.write(count + 1)

    def _initonce(self):
        source = self.source.values
        if not source:
            raise RuntimeError(
                f'SlowModel {self.model.path}: the source {self.source.path} '
                f'has no parameters yet; call the source before the slow copy.')
        if not self.model.values:
            prefix = self.model.path + '/'
            nj.context().update({prefix + k: v for k, v in source.items()})
        if self.model.values.keys() != source.keys():
            raise ValueError(
                f'SlowModel {self.model.path} and its source '
                f'{self.source.path} have different parameters: '
                f'{sorted(self.model.values)} vs {sorted(source)}.')


class LayerScan:
    """Runs the listed methods of `module` as a `jax.lax.scan` over `count`
    layers: every parameter of the module gets a leading axis of size
    `count`, the first positional argument is the carry passed from layer to
    layer, and the other positional arguments are scanned over their leading
    axis. Extra outputs of the method are stacked."""

    def __init__(self, module, count, names=('__call__',)):
        self.module = module
        self.count = count
        self.names = names

    def __call__(self, *args, **kwargs):
        return self.__getattr__('__call__')(*args, **kwargs)

    def __getattr__(self, name):
        if name in ('module', 'count', 'names'):
            raise AttributeError(name)
        value = getattr(self.module, name)
        if name in self.names:
            value = functools.partial(
                layer_scan, nj.pure(value, nested=True), self.module.path,
                self.count)
        return value


def layer_scan(fn, scope, count, inp, *args, **kwargs):
    """Scans the pure function `fn` over `count` layers whose state entries
    under `scope` are stacked along a leading axis (see `LayerScan`)."""
    prefix = scope + '/'
    inner = lambda xs: {k: v for k, v in xs.items() if k.startswith(prefix)}
    outer = lambda xs: {k: v for k, v in xs.items() if not k.startswith(prefix)}
    ctx = nj.context()

    # Trace one layer to learn which entries it reads, writes and creates.
    first = lambda xs: jax.tree.map(lambda x: x[0], xs)
    probe_state = {
        k: v[0] if k.startswith(prefix) else v for k, v in ctx.items()}
    state, _, accessed, modified, created = fn(
        probe_state, inp, *first(args), ignore=True, track=True,
        seed=nj.seed(None, True), **jax.tree.map(lambda x: x, kwargs))

    # New entries outside the scope are created once here; new entries inside
    # it are created per layer by the scan below.
    ctx.update(outer({k: v for k, v in state.items() if k in created}))
    fixed = {
        k: v for k, v in ctx.items()
        if k in accessed and k not in modified and k not in created}
    fixed_inner, fixed_outer = inner(fixed), outer(fixed)
    # Stacked inner entries do not change between layers, so only existing
    # ones are threaded; outer entries can change and are carried.
    changing_inner = inner({
        k: v for k, v in ctx.items() if k in modified and k not in created})
    changing_outer = outer({k: v for k, v in state.items() if k in modified})

    def body(carry, xs):
        x, carried_outer = carry
        layer_args, seed, layer_fixed, layer_changing = xs
        state = {
            **layer_fixed, **fixed_outer, **layer_changing, **carried_outer}
        state, out = fn(state, x, *layer_args, **kwargs, seed=seed)
        out, *extra = out if isinstance(out, tuple) else (out,)
        changed = {k: v for k, v in state.items() if k in modified}
        new_inner = inner({k: v for k, v in state.items() if k in created})
        return (out, outer(changed)), (extra, new_inner, inner(changed))

    (out, changing_outer), (extra, created_inner, changing_inner) = (
        jax.lax.scan(
            body, (inp, changing_outer),
            (args, nj.seed(count, True), fixed_inner, changing_inner),
            length=count))

    if ctx.modify:
        ctx.update(created_inner)
        ctx.update(changing_inner)
        ctx.update(changing_outer)
    return (out, *extra) if extra else out
