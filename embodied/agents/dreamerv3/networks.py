"""Encoder, decoder and MLP heads of the DreamerV3 agent."""

import math

import jax
import jax.numpy as jnp
import numpy as np

from embodied.jax import legacy_nets as nets, legacy_outs as outs

f32 = jnp.float32

SCALAR_OUTPUTS = ('symexp_twohot', 'mse', 'symlog_mse')
HEAD_OUTPUTS = (
    'symexp_twohot', 'mse', 'symlog_mse', 'binary', 'categorical',
    'bounded_normal')


def split_keys(space):
    """Vector keys (at most 2 dims) and image keys (3 dims, uint8)."""
    vec = sorted(k for k, s in space.items() if len(s.shape) <= 2)
    img = sorted(k for k, s in space.items() if len(s.shape) == 3)
    bad = sorted(set(space) - set(vec) - set(img))
    if bad:
        raise ValueError(
            f'Observations {bad} have more than 3 dims; the encoder takes '
            f'vectors and (H, W, C) images.')
    return vec, img


class Head(nets.Module):
    """Maps features to one output distribution for a space."""

    def __init__(self, din, space, output, winit='trunc_normal_in',
                 outscale=1.0, bins=255, minstd=1.0, maxstd=1.0, unimix=0.0,
                 dtype=f32):
        if output not in HEAD_OUTPUTS:
            raise ValueError(
                f"Unsupported head output '{output}'; choose one of "
                f"{', '.join(HEAD_OUTPUTS)}.")
        self.space, self.output, self.dims = space, output, len(space.shape)
        self.bins, self.minstd, self.maxstd = bins, minstd, maxstd
        self.unimix = unimix
        shape = tuple(space.shape)
        kw = dict(winit=winit, outscale=outscale, dtype=dtype)
        if output == 'symexp_twohot':
            if shape:
                raise ValueError('symexp_twohot heads predict scalars only.')
            self.children = {'logits': nets.Linear(din, bins, **kw)}
        elif output == 'categorical':
            if not space.discrete:
                raise ValueError(f'categorical output needs a discrete space: {space}')
            classes = int(np.max(space.high))
            self.children = {'logits': nets.Linear(din, (*shape, classes), **kw)}
        elif output == 'bounded_normal':
            self.children = {
                'mean': nets.Linear(din, shape, **kw),
                'stddev': nets.Linear(din, shape, **kw)}
        else:
            self.children = {'out': nets.Linear(din, shape or (1,), **kw)}

    def __call__(self, params, x):
        if self.output == 'symexp_twohot':
            logits = self.children['logits'](params['logits'], x)
            return outs.TwoHot(logits, outs.symexp_bins(self.bins))
        if self.output == 'categorical':
            logits = self.children['logits'](params['logits'], x)
            return outs.Categorical(logits, self.unimix, self.dims)
        if self.output == 'bounded_normal':
            mean = self.children['mean'](params['mean'], x)
            std = self.children['stddev'](params['stddev'], x).astype(f32)
            lo, hi = self.minstd, self.maxstd
            std = (hi - lo) * jax.nn.sigmoid(std + 2.0) + lo
            dist = outs.Normal(jnp.tanh(mean.astype(f32)), std, self.dims)
            size = math.prod(self.space.shape)
            gauss = lambda s: size * (0.5 * math.log(2 * math.pi * math.e * s * s))
            dist.minent, dist.maxent = gauss(lo), gauss(hi)
            return dist
        out = self.children['out'](params['out'], x)
        if not self.space.shape:
            out = out[..., 0]
        if self.output == 'binary':
            return outs.Binary(out)
        transform = nets.symlog if self.output == 'symlog_mse' else None
        return outs.MSE(out, transform, self.dims)


class MLPHead(nets.Module):
    """An MLP torso followed by one head per space (a dict of spaces gives a
    dict of distributions)."""

    def __init__(self, din, spaces, outputs, layers, units, act='silu',
                 norm='rms', winit='trunc_normal_in', dtype=f32, **headkw):
        self.single = not isinstance(spaces, dict)
        spaces = {'out': spaces} if self.single else spaces
        outputs = outputs if isinstance(outputs, dict) else {
            k: outputs for k in spaces}
        mlp = nets.MLP(din, layers, units, act, norm, winit, dtype)
        self.children = {'mlp': mlp}
        for key, space in spaces.items():
            self.children[f'head_{key}'] = Head(
                mlp.dout, space, outputs[key], winit=winit, dtype=dtype,
                **headkw)
        self.keys = sorted(spaces)

    def __call__(self, params, x):
        x = self.children['mlp'](params['mlp'], x)
        dists = {
            k: self.children[f'head_{k}'](params[f'head_{k}'], x)
            for k in self.keys}
        return dists['out'] if self.single else dists


class Encoder(nets.Module):
    """Vectors: symlog, concatenate, MLP. Images: a CNN that halves the
    resolution per stage. The outputs are concatenated into one token."""

    def __init__(self, obs_space, units, layers, depth, mults, kernel=5,
                 act='silu', norm='rms', winit='trunc_normal_in', symlog=True,
                 outer=False, strided=False, dtype=f32):
        self.obs_space = obs_space
        self.veckeys, self.imgkeys = split_keys(obs_space)
        self.symlog, self.strided, self.outer = symlog, strided, outer
        self.act = nets.activation(act)
        self.children = {}
        self.dout = 0
        if self.veckeys:
            din = sum(nets.flat_size(obs_space[k]) for k in self.veckeys)
            self.children['mlp'] = nets.MLP(
                din, layers, units, act, norm, winit, dtype)
            self.dout += self.children['mlp'].dout
        if self.imgkeys:
            shapes = {obs_space[k].shape[:2] for k in self.imgkeys}
            if len(shapes) > 1:
                raise ValueError(f'Image observations differ in size: {shapes}.')
            height, width = size = next(iter(shapes))
            channels = sum(obs_space[k].shape[-1] for k in self.imgkeys)
            for i, mult in enumerate(mults):
                stride = 2 if strided and not (outer and i == 0) else 1
                self.children[f'conv{i}'] = nets.Conv2D(
                    channels, depth * mult, kernel, stride, winit=winit,
                    dtype=dtype)
                self.children[f'conv{i}norm'] = nets.Norm(
                    depth * mult, norm, dtype=dtype)
                channels = depth * mult
                if not (outer and i == 0):
                    height, width = height // 2, width // 2
            if not (2 <= height <= 16 and 2 <= width <= 16):
                raise ValueError(
                    f'The CNN turns {size[0]}x{size[1]} images into '
                    f'{height}x{width}; pick enc.simple.mults so it ends '
                    f'between 2 and 16 pixels.')
            self.conv_layers = len(mults)
            self.dout += height * width * channels

    def __call__(self, params, obs):
        parts = []
        if self.veckeys:
            spaces = {k: self.obs_space[k] for k in self.veckeys}
            squish = nets.symlog if self.symlog else None
            x = nets.concat_spaces(spaces, obs, squish)
            parts.append(self.children['mlp'](params['mlp'], x))
        if self.imgkeys:
            x = jnp.concatenate([obs[k] for k in self.imgkeys], -1)
            x = x.astype(f32) / 255 - 0.5
            bshape = x.shape[:-3]
            x = x.reshape((-1, *x.shape[-3:]))
            for i in range(self.conv_layers):
                x = self.children[f'conv{i}'](params[f'conv{i}'], x)
                if not self.strided and not (self.outer and i == 0):
                    n, h, w, c = x.shape
                    x = x.reshape((n, h // 2, 2, w // 2, 2, c)).max((2, 4))
                x = self.children[f'conv{i}norm'](params[f'conv{i}norm'], x)
                x = self.act(x)
            parts.append(x.reshape((*bshape, -1)))
        return jnp.concatenate([p.astype(f32) for p in parts], -1)


class Decoder(nets.Module):
    """Reconstructs observations from the latent features: symlog MSE for
    continuous vectors, categorical for discrete ones, MSE for images."""

    def __init__(self, obs_space, deter, stochflat, units, layers, depth, mults,
                 kernel=5, act='silu', norm='rms', winit='trunc_normal_in',
                 outscale=1.0, bspace=8, outer=False, strided=False,
                 symlog=True, dtype=f32):
        self.obs_space = obs_space
        self.veckeys, self.imgkeys = split_keys(obs_space)
        self.deter, self.bspace = deter, bspace
        self.strided, self.outer = strided, outer
        self.act = nets.activation(act)
        feat = deter + stochflat
        self.children = {}
        if self.veckeys:
            spaces = {k: obs_space[k] for k in self.veckeys}
            cont = 'symlog_mse' if symlog else 'mse'
            outputs = {
                k: 'categorical' if s.discrete else cont
                for k, s in spaces.items()}
            self.children['vec'] = MLPHead(
                feat, spaces, outputs, layers, units, act, norm, winit, dtype,
                outscale=outscale)
        if self.imgkeys:
            self._build_image(
                feat, stochflat, units, depth, mults, kernel, norm, winit,
                outscale, dtype)

    def _build_image(self, feat, stochflat, units, depth, mults, kernel, norm,
                     winit, outscale, dtype):
        height, width = self.obs_space[self.imgkeys[0]].shape[:2]
        self.channels = [self.obs_space[k].shape[-1] for k in self.imgkeys]
        depths = [depth * m for m in mults]
        factor = 2 ** (len(depths) - int(bool(self.outer)))
        self.minres = (height // factor, width // factor)
        self.space_shape = (*self.minres, depths[-1])
        size = math.prod(self.space_shape)
        kw = dict(winit=winit, dtype=dtype)
        if self.bspace:
            if self.deter % self.bspace or depths[-1] % self.bspace:
                raise ValueError(
                    f'dec.bspace {self.bspace} must divide rssm.deter '
                    f'{self.deter} and the last CNN depth {depths[-1]}.')
            self.children['sp0'] = nets.BlockLinear(
                self.deter, size, self.bspace, **kw)
            self.children['sp1'] = nets.Dense(
                stochflat, 2 * units, 'none', norm, **kw)
            self.children['sp2'] = nets.Linear(2 * units, self.space_shape, **kw)
        else:
            self.children['sp2'] = nets.Linear(feat, self.space_shape, **kw)
        self.children['spnorm'] = nets.Norm(depths[-1], norm, dtype=dtype)
        self.upconvs = []
        for i in reversed(range(len(depths) - 1)):
            self.children[f'conv{i}'] = nets.Conv2D(
                depths[i + 1], depths[i], kernel, 2 if self.strided else 1,
                transp=self.strided, **kw)
            self.children[f'conv{i}norm'] = nets.Norm(depths[i], norm, dtype=dtype)
            self.upconvs.append(i)
        upsample = not self.outer
        self.out_upsample = upsample
        self.children['imgout'] = nets.Conv2D(
            depths[0], sum(self.channels), kernel,
            2 if (self.strided and upsample) else 1,
            transp=self.strided and upsample, winit=winit, outscale=outscale,
            dtype=dtype)

    def __call__(self, params, feat):
        deter = feat['deter']
        stoch = feat['stoch'].reshape((*feat['stoch'].shape[:-2], -1))
        bshape = deter.shape[:-1]
        dists = {}
        if self.veckeys:
            x = jnp.concatenate([stoch, deter], -1)
            dists.update(self.children['vec'](params['vec'], x))
        if self.imgkeys:
            dists.update(self._image(params, deter, stoch, bshape))
        return dists

    def _image(self, params, deter, stoch, bshape):
        deter = deter.reshape((-1, deter.shape[-1]))
        stoch = stoch.reshape((-1, stoch.shape[-1]))
        if self.bspace:
            x0 = self.children['sp0'](params['sp0'], deter)
            g, (h, w, c) = self.bspace, self.space_shape
            x0 = x0.reshape((-1, g, h, w, c // g)).transpose((0, 2, 3, 1, 4))
            x0 = x0.reshape((-1, h, w, c))
            x1 = self.act(self.children['sp1'](params['sp1'], stoch))
            x1 = self.children['sp2'](params['sp2'], x1)
            x = x0 + x1
        else:
            x = self.children['sp2'](params['sp2'], jnp.concatenate(
                [stoch, deter], -1))
        x = self.act(self.children['spnorm'](params['spnorm'], x))
        for i in self.upconvs:
            if not self.strided:
                x = x.repeat(2, -2).repeat(2, -3)
            x = self.children[f'conv{i}'](params[f'conv{i}'], x)
            x = self.act(self.children[f'conv{i}norm'](params[f'conv{i}norm'], x))
        if self.out_upsample and not self.strided:
            x = x.repeat(2, -2).repeat(2, -3)
        x = jax.nn.sigmoid(self.children['imgout'](params['imgout'], x).astype(f32))
        x = x.reshape((*bshape, *x.shape[1:]))
        dists = {}
        splits = np.cumsum(self.channels)[:-1]
        for key, value in zip(self.imgkeys, jnp.split(x, splits, -1)):
            dists[key] = outs.MSE(value, None, 3)
        return dists
