"""The recurrent state-space model: a deterministic state `deter` updated by
a block-diagonal GRU, and `stoch` categorical latents (a posterior from the
observation token, a prior from `deter` alone)."""

import jax
import jax.numpy as jnp

from embodied.jax import legacy_nets as nets, legacy_outs as outs

f32 = jnp.float32
sg = jax.lax.stop_gradient


class RSSM(nets.Module):

    def __init__(self, act_space, token_dim, deter=4096, hidden=2048, stoch=32,
                 classes=32, act='silu', norm='rms', unimix=0.01, outscale=1.0,
                 winit='trunc_normal_in', imglayers=2, obslayers=1, dynlayers=1,
                 absolute=False, blocks=8, free_nats=1.0, dtype=f32):
        if deter % blocks:
            raise ValueError(
                f'rssm.deter {deter} must divide into rssm.blocks {blocks}.')
        self.act_space = act_space
        self.deter, self.hidden, self.stoch, self.classes = (
            deter, hidden, stoch, classes)
        self.blocks, self.unimix, self.free_nats = blocks, unimix, free_nats
        self.absolute = absolute
        self.dtype = dtype
        self.imglayers, self.obslayers, self.dynlayers = (
            imglayers, obslayers, dynlayers)
        actdim = sum(nets.flat_size(s) for s in act_space.values())
        kw = dict(act=act, norm=norm, winit=winit, dtype=dtype)
        c = self.children = {}
        c['dynin0'] = nets.Dense(deter, hidden, **kw)
        c['dynin1'] = nets.Dense(stoch * classes, hidden, **kw)
        c['dynin2'] = nets.Dense(actdim, hidden, **kw)
        width = deter + blocks * 3 * hidden
        for i in range(dynlayers):
            c[f'dynhid{i}'] = nets.Dense(
                width if i == 0 else deter, deter, blocks=blocks, **kw)
        c['dyngru'] = nets.BlockLinear(
            deter if dynlayers else width, 3 * deter, blocks, winit=winit,
            dtype=dtype)
        obsin = token_dim if absolute else deter + token_dim
        for i in range(obslayers):
            c[f'obs{i}'] = nets.Dense(obsin if i == 0 else hidden, hidden, **kw)
        c['obslogit'] = nets.Linear(
            hidden if obslayers else obsin, (stoch, classes), winit=winit,
            outscale=outscale, dtype=dtype)
        for i in range(imglayers):
            c[f'prior{i}'] = nets.Dense(deter if i == 0 else hidden, hidden, **kw)
        c['priorlogit'] = nets.Linear(
            hidden if imglayers else deter, (stoch, classes), winit=winit,
            outscale=outscale, dtype=dtype)

    @property
    def feat_size(self):
        return self.deter + self.stoch * self.classes

    def initial(self, batch_size):
        return {
            'deter': jnp.zeros((batch_size, self.deter), f32),
            'stoch': jnp.zeros((batch_size, self.stoch, self.classes), f32)}

    def dist(self, logit):
        return outs.OneHot(logit, self.unimix, dims=1)

    def observe_step(self, params, carry, token, prevact, reset, key):
        """One posterior step. Returns (carry, feat); feat adds the logits."""
        keep = (~reset).astype(f32)
        deter = carry['deter'] * keep[:, None]
        stoch = carry['stoch'] * keep[:, None, None]
        prevact = jax.tree.map(
            lambda x: x * keep.reshape((-1,) + (1,) * (x.ndim - 1)).astype(
                x.dtype), prevact)
        deter = self._core(params, deter, stoch, prevact)
        x = token if self.absolute else jnp.concatenate(
            [deter, token.astype(f32)], -1)
        for i in range(self.obslayers):
            x = self.children[f'obs{i}'](params[f'obs{i}'], x)
        logit = self.children['obslogit'](params['obslogit'], x).astype(f32)
        stoch = self.dist(logit).sample(key)
        return {'deter': deter, 'stoch': stoch}, {
            'deter': deter, 'stoch': stoch, 'logit': logit}

    def observe(self, params, carry, tokens, prevacts, resets, key):
        """Posterior over a (B, T) sequence: (carry, feats (B, T))."""
        T = resets.shape[1]
        keys = jax.random.split(key, T)
        swap = lambda x: jnp.swapaxes(x, 0, 1)

        def step(carry, inputs):
            token, prevact, reset, key = inputs
            return self.observe_step(params, carry, token, prevact, reset, key)

        carry, feats = jax.lax.scan(
            step, carry,
            (swap(tokens), jax.tree.map(swap, prevacts), swap(resets), keys))
        return carry, jax.tree.map(swap, feats)

    def imagine_step(self, params, carry, action, key):
        deter = self._core(params, carry['deter'], carry['stoch'], action)
        logit = self.prior(params, deter)
        stoch = self.dist(logit).sample(key)
        return {'deter': deter, 'stoch': stoch}, {
            'deter': deter, 'stoch': stoch, 'logit': logit}

    def imagine(self, params, carry, policy, length, key):
        """Rolls the prior forward. `policy(feat, key) -> action` or a dict
        of (B, length) actions. Returns (carry, feats, actions), each (B, L),
        where actions[:, t] led to feats[:, t]."""
        keys = jax.random.split(key, length)
        swap = lambda x: jnp.swapaxes(x, 0, 1)
        if callable(policy):
            def step(carry, key):
                k1, k2 = jax.random.split(key)
                action = policy(carry, k1)
                carry, feat = self.imagine_step(params, carry, action, k2)
                return carry, (feat, action)
            carry, (feats, actions) = jax.lax.scan(step, carry, keys)
        else:
            def step(carry, inputs):
                action, key = inputs
                carry, feat = self.imagine_step(params, carry, action, key)
                return carry, (feat, action)
            carry, (feats, actions) = jax.lax.scan(
                step, carry, (jax.tree.map(swap, policy), keys))
        return carry, jax.tree.map(swap, feats), jax.tree.map(swap, actions)

    def prior(self, params, deter):
        x = deter
        for i in range(self.imglayers):
            x = self.children[f'prior{i}'](params[f'prior{i}'], x)
        return self.children['priorlogit'](params['priorlogit'], x).astype(f32)

    def kl_losses(self, params, feats):
        """The dynamics and representation losses with free nats: the prior
        learns to predict the posterior (dyn), the posterior is regularised
        towards the prior (rep)."""
        prior = self.prior(params, feats['deter'])
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

    def _core(self, params, deter, stoch, action):
        c, g = self.children, self.blocks
        action = nets.concat_spaces(self.act_space, action)
        action = action / sg(jnp.maximum(1, jnp.abs(action)))
        stoch = stoch.reshape((*stoch.shape[:-2], -1))
        x0 = c['dynin0'](params['dynin0'], deter)
        x1 = c['dynin1'](params['dynin1'], stoch)
        x2 = c['dynin2'](params['dynin2'], action)
        mixed = jnp.concatenate([x0, x1, x2], -1).astype(f32)
        grouped = lambda x: x.reshape((*x.shape[:-1], g, -1))
        # Every block sees its own slice of deter plus all of the inputs.
        x = jnp.concatenate([
            grouped(deter), jnp.repeat(mixed[..., None, :], g, -2)], -1)
        x = x.reshape((*x.shape[:-2], -1))
        for i in range(self.dynlayers):
            x = c[f'dynhid{i}'](params[f'dynhid{i}'], x)
        x = c['dyngru'](params['dyngru'], x).astype(f32)
        reset, cand, update = [
            y.reshape((*y.shape[:-2], -1))
            for y in jnp.split(grouped(x), 3, -1)]
        reset = jax.nn.sigmoid(reset)
        cand = jnp.tanh(reset * cand)
        update = jax.nn.sigmoid(update - 1)
        return update * cand + (1 - update) * deter
