"""The world model's networks as `embodied.jax` modules: the recurrent
state-space model (a deterministic state `deter` updated by a block-diagonal
GRU, and `stoch` categorical latents: a posterior from the observation
token, a prior from `deter` alone), the encoder and the decoder."""

import math

import elements
import jax
import jax.numpy as jnp
import ninjax as nj
import numpy as np

import embodied.jax
from embodied.jax import nets, outs

from . import spaces

f32 = jnp.float32
sg = jax.lax.stop_gradient


MAX_CLASSES = spaces.MAX_CLASSES


def vector_space(space):
    """The space the networks use for a vector observation: itself, or a
    float32 space for an integer with more than MAX_CLASSES classes."""
    if space.discrete and space.dtype != bool:
        classes = np.max(np.int64(space.high) - np.int64(space.low))
        if classes > MAX_CLASSES:
            return elements.Space(np.float32, space.shape)
    return space


def split_keys(space):
    """Vector keys (at most 2 dims) and image keys (3 dims)."""
    vec = sorted(k for k, s in space.items() if len(s.shape) <= 2)
    img = sorted(k for k, s in space.items() if len(s.shape) == 3)
    bad = sorted(set(space) - set(vec) - set(img))
    if bad:
        raise ValueError(
            f'Observations {bad} have more than 3 dims; the encoder takes '
            f'vectors and (H, W, C) images.')
    return vec, img


class RSSM(nj.Module):
    """`RSSM(act_space, **config.dyn.rssm, name='dyn')`."""

    def __init__(
            self, act_space, deter=4096, hidden=2048, stoch=32, classes=32,
            act='silu', norm='rms', unimix=0.01, outscale=1.0,
            winit='trunc_normal_in', imglayers=2, obslayers=1, dynlayers=1,
            absolute=False, blocks=8, free_nats=1.0):
        if deter % blocks:
            raise ValueError(
                f'rssm.deter {deter} must divide into rssm.blocks {blocks}.')
        self.act_space = act_space
        self.deter, self.hidden = deter, hidden
        self.stoch, self.classes = stoch, classes
        self.actfn, self.norm, self.winit = nets.act(act), norm, winit
        self.unimix, self.outscale = unimix, outscale
        self.imglayers, self.obslayers = imglayers, obslayers
        self.dynlayers, self.absolute = dynlayers, absolute
        self.blocks, self.free_nats = blocks, free_nats
        self.actconcat = nets.DictConcat(act_space, 1)

    def initial(self, batch_size):
        return {
            'deter': jnp.zeros((batch_size, self.deter), f32),
            'stoch': jnp.zeros((batch_size, self.stoch, self.classes), f32)}

    def dist(self, logit):
        return outs.Agg(outs.OneHot(logit, self.unimix), 1, jnp.sum)

    def observe_step(self, carry, token, prevact, reset):
        """One posterior step: (carry, feat); feat adds the logits."""
        deter, stoch = nets.mask((carry['deter'], carry['stoch']), ~reset)
        # A reset step has no previous action: its encoding is all zeros
        # (masking the action itself would encode a discrete one as class 0).
        action = nets.mask(self.actconcat(prevact).astype(f32), ~reset)
        deter = self._core(deter, stoch, action)
        x = token if self.absolute else jnp.concatenate(
            [deter, token.astype(f32)], -1)
        x = nets.cast(x)
        for i in range(self.obslayers):
            x = self._dense(f'obs{i}', self.hidden, x)
        logit = self._logit('obslogit', x)
        stoch = self.dist(logit).sample(nj.seed())
        return {'deter': deter, 'stoch': stoch}, {
            'deter': deter, 'stoch': stoch, 'logit': logit}

    def observe(self, carry, tokens, prevacts, resets):
        """Posterior over a (B, T) sequence: (carry, feats (B, T))."""
        def step(carry, inputs):
            return self.observe_step(carry, *inputs)
        carry, feats = nj.scan(
            step, carry, (tokens, prevacts, resets), axis=1)
        return carry, feats

    def imagine_step(self, carry, action):
        action = self.actconcat(action).astype(f32)
        deter = self._core(carry['deter'], carry['stoch'], action)
        logit = self.prior(deter)
        stoch = self.dist(logit).sample(nj.seed())
        return {'deter': deter, 'stoch': stoch}, {
            'deter': deter, 'stoch': stoch, 'logit': logit}

    def imagine(self, carry, policy, length):
        """Rolls the prior forward with `policy(feat) -> action`. Returns
        (carry, feats, actions), each (B, length), where actions[:, t] led
        to feats[:, t]."""
        def step(carry, _):
            action = policy(carry)
            carry, feat = self.imagine_step(carry, action)
            return carry, (feat, action)
        carry, (feats, actions) = nj.scan(
            step, carry, jnp.zeros((length,)), length)
        swap = lambda x: jnp.swapaxes(x, 0, 1)
        return carry, jax.tree.map(swap, feats), jax.tree.map(swap, actions)

    def prior(self, deter):
        x = nets.cast(deter)
        for i in range(self.imglayers):
            x = self._dense(f'prior{i}', self.hidden, x)
        return self._logit('priorlogit', x)

    def kl_losses(self, feats):
        """Dynamics and representation losses with free nats: the prior
        learns to predict the posterior (dyn), the posterior is regularised
        towards the prior (rep)."""
        prior = self.prior(feats['deter'])
        post = feats['logit']
        dyn = self.dist(sg(post)).kl(self.dist(prior))
        rep = self.dist(post).kl(self.dist(sg(prior)))
        if self.free_nats:
            dyn = jnp.maximum(dyn, self.free_nats)
            rep = jnp.maximum(rep, self.free_nats)
        metrics = {
            'dyn_ent': self.dist(prior).entropy().mean(),
            'rep_ent': self.dist(post).entropy().mean()}
        return {'dyn': dyn, 'rep': rep}, metrics

    def _core(self, deter, stoch, action):
        """One GRU step from the state and the encoded action."""
        g = self.blocks
        action = action / sg(jnp.maximum(1, jnp.abs(action)))
        stoch = stoch.reshape((*stoch.shape[:-2], -1))
        x0 = self._dense('dynin0', self.hidden, nets.cast(deter))
        x1 = self._dense('dynin1', self.hidden, nets.cast(stoch))
        x2 = self._dense('dynin2', self.hidden, nets.cast(action))
        mixed = jnp.concatenate([x0, x1, x2], -1)
        grouped = lambda x: x.reshape((*x.shape[:-1], g, -1))
        # Every block sees its own slice of deter plus all of the inputs.
        x = jnp.concatenate([
            grouped(nets.cast(deter)),
            jnp.repeat(mixed[..., None, :], g, -2)], -1)
        x = x.reshape((*x.shape[:-2], -1))
        for i in range(self.dynlayers):
            x = self._dense(f'dynhid{i}', self.deter, x, blocks=g)
        x = self.sub(
            'dyngru', nets.BlockLinear, 3 * self.deter, g,
            winit=self.winit)(x).astype(f32)
        reset, cand, update = [
            y.reshape((*y.shape[:-2], -1))
            for y in jnp.split(grouped(x), 3, -1)]
        reset = jax.nn.sigmoid(reset)
        cand = jnp.tanh(reset * cand)
        update = jax.nn.sigmoid(update - 1)
        return update * cand + (1 - update) * deter

    def _dense(self, name, units, x, blocks=0):
        if blocks:
            layer = self.sub(
                name, nets.BlockLinear, units, blocks, winit=self.winit)
        else:
            layer = self.sub(name, nets.Linear, units, winit=self.winit)
        x = self.sub(f'{name}norm', nets.Norm, self.norm)(layer(x))
        return self.actfn(x)

    def _logit(self, name, x):
        shape = (self.stoch, self.classes)
        return self.sub(
            name, nets.Linear, shape, winit=self.winit,
            outscale=float(self.outscale))(x).astype(f32)


class Encoder(nj.Module):
    """Vectors: symlog, concatenate, MLP. Images: a CNN that halves the
    resolution per stage. The outputs are concatenated into one token."""

    def __init__(
            self, obs_space, units=1024, layers=3, depth=64,
            mults=(2, 3, 4, 4), kernel=5, act='silu', norm='rms',
            winit='trunc_normal_in', symlog=True, outer=False,
            strided=False):
        self.obs_space = obs_space
        self.veckeys, self.imgkeys = split_keys(obs_space)
        self.units, self.layers, self.depth = units, layers, depth
        self.mults, self.kernel = tuple(mults), kernel
        self.act, self.norm, self.winit = act, norm, winit
        self.symlog, self.outer, self.strided = symlog, outer, strided
        self.vecspaces = {k: vector_space(obs_space[k]) for k in self.veckeys}
        if self.veckeys:
            squish = nets.symlog if symlog else (lambda x: x)
            self.vecconcat = nets.DictConcat(self.vecspaces, 1, squish=squish)
        if self.imgkeys:
            self._check_images()

    def _check_images(self):
        shapes = {self.obs_space[k].shape[:2] for k in self.imgkeys}
        if len(shapes) > 1:
            raise ValueError(f'Image observations differ in size: {shapes}.')
        problem = spaces.encoder_problem(
            next(iter(shapes)), self.mults, self.outer)
        if problem:
            raise ValueError(f'The encoder: {problem}')

    def __call__(self, obs):
        parts = []
        if self.veckeys:
            x = self.vecconcat({
                k: obs[k].astype(self.vecspaces[k].dtype) for k in self.veckeys})
            mlp = self.sub(
                'mlp', nets.MLP, self.layers, self.units, act=self.act,
                norm=self.norm, winit=self.winit)
            parts.append(mlp(x))
        if self.imgkeys:
            parts.append(self._images(obs))
        return jnp.concatenate([p.astype(f32) for p in parts], -1)

    def _images(self, obs):
        actfn = nets.act(self.act)
        x = jnp.concatenate([obs[k] for k in self.imgkeys], -1)
        x = nets.cast(x.astype(f32) / 255 - 0.5)
        bshape = x.shape[:-3]
        x = x.reshape((-1, *x.shape[-3:]))
        for i, mult in enumerate(self.mults):
            first = self.outer and i == 0
            stride = 2 if self.strided and not first else 1
            x = self.sub(
                f'conv{i}', nets.Conv2D, self.depth * mult, self.kernel,
                stride, winit=self.winit)(x)
            if not self.strided and not first:
                n, h, w, c = x.shape
                x = x.reshape((n, h // 2, 2, w // 2, 2, c)).max((2, 4))
            x = actfn(self.sub(f'conv{i}norm', nets.Norm, self.norm)(x))
        return x.reshape((*bshape, -1))


class Decoder(nj.Module):
    """Reconstructs observations from the latent features: symlog MSE for
    continuous vectors, categorical for discrete ones, MSE for images."""

    def __init__(
            self, obs_space, units=1024, layers=3, depth=64,
            mults=(2, 3, 4, 4), kernel=5, act='silu', norm='rms',
            winit='trunc_normal_in', outscale=1.0, bspace=8, outer=False,
            strided=False, symlog=True):
        self.obs_space = obs_space
        self.veckeys, self.imgkeys = split_keys(obs_space)
        self.units, self.layers, self.depth = units, layers, depth
        self.mults, self.kernel = tuple(mults), kernel
        self.act, self.norm, self.winit = act, norm, winit
        self.outscale, self.bspace = outscale, bspace
        self.outer, self.strided = outer, strided
        self.vecspaces = {k: vector_space(obs_space[k]) for k in self.veckeys}
        if self.veckeys:
            cont = 'symlog_mse' if symlog else 'mse'
            outputs = {
                k: 'categorical' if s.discrete else cont
                for k, s in self.vecspaces.items()}
            self.vec = embodied.jax.MLPHead(
                self.vecspaces, outputs, layers=layers, units=units, act=act,
                norm=norm, winit=winit, outscale=float(outscale), name='vec')

    def __call__(self, feat):
        deter = feat['deter']
        stoch = feat['stoch'].reshape((*feat['stoch'].shape[:-2], -1))
        bdims = deter.ndim - 1
        dists = {}
        if self.veckeys:
            x = nets.cast(jnp.concatenate([stoch, deter], -1))
            dists.update(self.vec(x, bdims))
        if self.imgkeys:
            dists.update(self._images(deter, stoch))
        return dists

    def _images(self, deter, stoch):
        actfn = nets.act(self.act)
        height, width = self.obs_space[self.imgkeys[0]].shape[:2]
        channels = [self.obs_space[k].shape[-1] for k in self.imgkeys]
        depths = [self.depth * m for m in self.mults]
        factor = 2 ** (len(depths) - int(bool(self.outer)))
        shape = (height // factor, width // factor, depths[-1])
        bshape = deter.shape[:-1]
        deter = nets.cast(deter.reshape((-1, deter.shape[-1])))
        stoch = nets.cast(stoch.reshape((-1, stoch.shape[-1])))
        kw = dict(winit=self.winit)
        if self.bspace:
            g, (h, w, c) = self.bspace, shape
            if deter.shape[-1] % g or c % g:
                raise ValueError(
                    f'dec.bspace {g} must divide rssm.deter {deter.shape[-1]} '
                    f'and the last CNN depth {c}.')
            x0 = self.sub(
                'sp0', nets.BlockLinear, math.prod(shape), g, **kw)(deter)
            x0 = x0.reshape((-1, g, h, w, c // g)).transpose((0, 2, 3, 1, 4))
            x0 = x0.reshape((-1, h, w, c))
            x1 = self.sub('sp1', nets.Linear, 2 * self.units, **kw)(stoch)
            x1 = actfn(self.sub('sp1norm', nets.Norm, self.norm)(x1))
            x1 = self.sub('sp2', nets.Linear, shape, **kw)(x1)
            x = x0 + x1
        else:
            x = self.sub('sp2', nets.Linear, shape, **kw)(
                jnp.concatenate([stoch, deter], -1))
        x = actfn(self.sub('spnorm', nets.Norm, self.norm)(x))
        for i in reversed(range(len(depths) - 1)):
            if not self.strided:
                x = x.repeat(2, -2).repeat(2, -3)
            x = self.sub(
                f'conv{i}', nets.Conv2D, depths[i], self.kernel,
                2 if self.strided else 1, transp=self.strided, **kw)(x)
            x = actfn(self.sub(f'conv{i}norm', nets.Norm, self.norm)(x))
        upsample = not self.outer
        if upsample and not self.strided:
            x = x.repeat(2, -2).repeat(2, -3)
        x = self.sub(
            'imgout', nets.Conv2D, sum(channels), self.kernel,
            2 if (self.strided and upsample) else 1,
            transp=self.strided and upsample, outscale=float(self.outscale),
            **kw)(x)
        x = jax.nn.sigmoid(x.astype(f32))
        x = x.reshape((*bshape, *x.shape[1:]))
        dists = {}
        splits = np.cumsum(channels)[:-1]
        for key, value in zip(self.imgkeys, jnp.split(x, splits, -1)):
            dists[key] = outs.Agg(outs.MSE(value), 3, jnp.sum)
        return dists
