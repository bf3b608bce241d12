"""DreamerV3 as pure functions: world model, imagination actor-critic and
the replay value loss, trained together by one optimizer."""

import elements
import jax
import jax.numpy as jnp
import numpy as np
import optax

import embodied.jax
from embodied.jax import legacy_opt as optlib

from . import networks, returns, settings
from .rssm import RSSM

f32 = jnp.float32
sg = jax.lax.stop_gradient
LATENT_KEYS = ('deter', 'stoch')
SIGNAL_KEYS = ('is_first', 'is_last', 'is_terminal', 'reward')


def sample(dists, key):
    keys = jax.random.split(key, len(dists))
    return {k: dists[k].sample(kk) for k, kk in zip(sorted(dists), keys)}


def flat_feat(feat):
    stoch = feat['stoch'].reshape((*feat['stoch'].shape[:-2], -1))
    return jnp.concatenate([feat['deter'].astype(f32), stoch.astype(f32)], -1)


class DreamerModel:
    """The pure functions the agent runs: `init_state(key)`, `policy(params,
    carry, obs, key, mode)`, `train(state, carry, data, key)`, `report(...)`
    and the carries' `init_*`."""

    def __init__(self, obs_space, act_space, config, dtype=f32):
        settings.check(config)
        self.config = config
        self.obs_space = obs_space
        self.act_space = act_space
        self.dec_space = {
            k: v for k, v in obs_space.items() if k not in SIGNAL_KEYS}
        missing = [k for k in SIGNAL_KEYS if k not in obs_space]
        if missing:
            raise ValueError(f'Observation space lacks {missing}.')
        rssm = config.dyn.rssm
        self.enc = networks.Encoder(
            self.dec_space, **config.enc.simple, dtype=dtype)
        self.dyn = RSSM(act_space, self.enc.dout, **rssm, dtype=dtype)
        self.dec = networks.Decoder(
            self.dec_space, rssm.deter, rssm.stoch * rssm.classes,
            **config.dec.simple, dtype=dtype)
        feat = self.dyn.feat_size
        scalar = elements.Space(np.float32, ())
        binary = elements.Space(bool, (), 0, 2)
        self.rew = self._head(feat, scalar, config.rewhead, dtype)
        self.con = self._head(feat, binary, config.conhead, dtype)
        self.val = self._head(feat, scalar, config.value, dtype)
        polcfg = dict(config.policy)
        outputs = {
            k: config.policy_dist_disc if s.discrete else config.policy_dist_cont
            for k, s in act_space.items()}
        self.pol = networks.MLPHead(
            feat, act_space, outputs, polcfg.pop('layers'), polcfg.pop('units'),
            polcfg.pop('act'), polcfg.pop('norm'), polcfg.pop('winit'), dtype,
            **polcfg)
        self.retnorm = returns.Normalize(**config.retnorm)
        self.valnorm = returns.Normalize(**config.valnorm)
        self.advnorm = returns.Normalize(**config.advnorm)
        self.opt = optlib.make_optimizer(**config.opt)
        scales = dict(config.loss_scales)
        rec = scales.pop('rec')
        scales.update({k: rec for k in self.dec_space})
        if not config.repval_loss:
            scales.pop('repval')
        self.scales = scales
        self.modules = dict(
            enc=self.enc, dyn=self.dyn, dec=self.dec, rew=self.rew,
            con=self.con, pol=self.pol, val=self.val)

    @staticmethod
    def _head(din, space, cfg, dtype):
        cfg = dict(cfg)
        output = cfg.pop('output')
        return networks.MLPHead(
            din, space, output, cfg.pop('layers'), cfg.pop('units'),
            cfg.pop('act'), cfg.pop('norm'), cfg.pop('winit'), dtype, **cfg)

    # Interface

    @property
    def ext_space(self):
        spaces = {
            'consec': elements.Space(np.int32),
            'stepid': elements.Space(np.uint8, 20)}
        if self.config.replay_context:
            rssm = self.config.dyn.rssm
            spaces['dyn/deter'] = elements.Space(np.float32, rssm.deter)
            spaces['dyn/stoch'] = elements.Space(
                np.float32, (rssm.stoch, rssm.classes))
        return spaces

    def init_state(self, key):
        keys = dict(zip(self.modules, jax.random.split(key, len(self.modules))))
        params = {k: m.init(keys[k]) for k, m in self.modules.items()}
        return {
            'params': params,
            'slowval': jax.tree.map(jnp.copy, params['val']),
            'opt': self.opt.init(params),
            'norms': self._init_norms(),
            'step': jnp.zeros((), jnp.int32),
        }

    def _init_norms(self):
        return {
            'retnorm': self.retnorm.init(), 'valnorm': self.valnorm.init(),
            'advnorm': self.advnorm.init()}

    def init_policy(self, batch_size):
        prevact = {
            k: jnp.zeros((batch_size, *s.shape), s.dtype)
            for k, s in self.act_space.items()}
        return {'dyn': self.dyn.initial(batch_size), 'prevact': prevact}

    def init_train(self, batch_size):
        return self.init_policy(batch_size)

    def init_report(self, batch_size):
        return self.init_policy(batch_size)

    def policy(self, params, carry, obs, key, mode):
        k1, k2 = jax.random.split(key)
        tokens = self.enc(params['enc'], obs)
        dyncarry, feat = self.dyn.observe_step(
            params['dyn'], carry['dyn'], tokens, carry['prevact'],
            obs['is_first'], k1)
        act = sample(self.pol(params['pol'], flat_feat(feat)), k2)
        out = {}
        if self.config.replay_context:
            out = {f'dyn/{k}': dyncarry[k] for k in LATENT_KEYS}
        return {'dyn': dyncarry, 'prevact': act}, act, out

    def train(self, state, carry, data, key):
        start, obs, prevact, stepid = self._apply_context(carry, data)

        def lossfn(params):
            return self.loss(
                params, state['slowval'], state['norms'], start, obs, prevact,
                key, training=True)

        (loss, aux), grads = jax.value_and_grad(lossfn, has_aux=True)(
            state['params'])
        dyncarry, entries, norms, metrics, _ = aux
        updates, opt_state = self.opt.update(
            grads, state['opt'], state['params'])
        params = optax.apply_updates(state['params'], updates)
        slowval = self._update_slow(state['slowval'], params['val'], state['step'])
        state = dict(
            params=params, slowval=slowval, opt=opt_state, norms=norms,
            step=state['step'] + 1)
        metrics.update({
            'opt/loss': loss,
            'opt/updates': state['step'],
            'opt/grad_norm': optax.global_norm(grads),
            'opt/update_rms': _rms(updates),
            'opt/param_rms': _rms(params),
        })
        outs = {}
        if self.config.replay_context and stepid is not None:
            outs['replay'] = {
                'stepid': stepid,
                **{f'dyn/{k}': entries[k] for k in LATENT_KEYS}}
        carry = {
            'dyn': dyncarry,
            'prevact': {k: data[k][:, -1] for k in self.act_space}}
        return state, carry, outs, metrics

    def report(self, state, carry, data, key):
        if not self.config.report:
            return carry, {}
        start, obs, prevact, _ = self._apply_context(carry, data)
        _, (dyncarry, _, _, metrics, _) = self.loss(
            state['params'], state['slowval'], state['norms'], start, obs,
            prevact, key, training=False)
        carry = {
            'dyn': dyncarry,
            'prevact': {k: data[k][:, -1] for k in self.act_space}}
        return carry, metrics

    # Training internals

    def _apply_context(self, carry, data):
        """Splits off the replay context: the first `replay_context` steps
        only provide the stored latent state training starts from."""
        K = self.config.replay_context
        obs = {k: data[k][:, K:] for k in self.obs_space}
        stepid = data['stepid'][:, K:] if 'stepid' in data else None
        if not K:
            prevact = {
                k: jnp.concatenate(
                    [carry['prevact'][k][:, None], data[k][:, :-1]], 1)
                for k in self.act_space}
            return carry['dyn'], obs, prevact, stepid
        prevact = {k: data[k][:, K - 1:-1] for k in self.act_space}
        B = obs['is_first'].shape[0]
        if 'dyn/deter' in data and 'dyn/stoch' in data:
            stored = {
                k: data[f'dyn/{k}'][:, K - 1].astype(f32) for k in LATENT_KEYS}
        else:
            # Batches without stored latents (e.g. from another agent's
            # replay) start from the zero state.
            stored = self.dyn.initial(B)
        if 'consec' in data:
            first = data['consec'][:, 0] == 0
        else:
            first = jnp.ones((B,), bool)
        start = jax.tree.map(
            lambda s, c: jnp.where(
                first.reshape((-1,) + (1,) * (s.ndim - 1)), s, c),
            stored, carry['dyn'])
        return start, obs, prevact, stepid

    def _update_slow(self, slow, fast, step):
        cfg = self.config.slowvalue
        mix = jnp.where(step % cfg.every == 0, cfg.rate, 0.0)
        return jax.tree.map(lambda s, f: mix * f + (1 - mix) * s, slow, fast)

    def loss(self, params, slowval, norms, start, obs, prevact, key, training):
        """Returns (loss, (carry, latent entries, norms, metrics, losses));
        `losses` holds each unscaled loss per example and step."""
        cfg = self.config
        B, T = obs['is_first'].shape
        k_obs, k_img, k_last = jax.random.split(key, 3)
        losses, metrics = {}, {}

        # World model
        tokens = self.enc(params['enc'], obs)
        dyncarry, feat = self.dyn.observe(
            params['dyn'], start, tokens, prevact, obs['is_first'], k_obs)
        kl, mets = self.dyn.kl_losses(params['dyn'], feat)
        losses.update(kl)
        metrics.update(mets)
        for key, dist in self.dec(params['dec'], feat).items():
            target = obs[key]
            if len(self.obs_space[key].shape) == 3:
                target = target.astype(f32) / 255
            losses[key] = dist.loss(target)
        featvec = flat_feat(feat)
        rewinp = featvec if cfg.reward_grad else sg(featvec)
        losses['rew'] = self.rew(params['rew'], rewinp).loss(obs['reward'])
        con = (~obs['is_terminal']).astype(f32)
        if cfg.contdisc:
            con *= 1 - 1 / cfg.horizon
        losses['con'] = self.con(params['con'], featvec).loss(con)

        # Imagination from the last K replayed states
        K = min(cfg.imag_last or T, T)
        H = cfg.imag_length
        starts = {
            k: sg(feat[k][:, -K:]).reshape((B * K, *feat[k].shape[2:]))
            for k in LATENT_KEYS}

        def policyfn(f, key):
            return sample(self.pol(params['pol'], sg(flat_feat(f))), key)

        _, imgfeat, imgact = self.dyn.imagine(
            params['dyn'], starts, policyfn, H, k_img)
        first = {
            k: feat[k][:, -K:].reshape((B * K, 1, *feat[k].shape[2:]))
            for k in LATENT_KEYS}
        first = first if cfg.ac_grads else sg(first)
        imgfeat = {
            k: jnp.concatenate([first[k], sg(imgfeat[k])], 1)
            for k in LATENT_KEYS}
        lastact = policyfn({k: v[:, -1] for k, v in imgfeat.items()}, k_last)
        imgact = {
            k: jnp.concatenate([imgact[k], lastact[k][:, None]], 1)
            for k in self.act_space}
        inp = flat_feat(imgfeat)
        los, imgret, norms, mets = self._imag_loss(
            params, slowval, norms, inp, imgact, training)
        losses.update({k: v.mean(1).reshape((B, K)) for k, v in los.items()})
        metrics.update(mets)

        # Replay value loss, bootstrapped from the imagined returns
        if cfg.repval_loss:
            repinp = featvec if cfg.repval_grad else sg(featvec)
            los, norms = self._repl_loss(
                params, slowval, norms, repinp[:, -K:],
                {k: obs[k][:, -K:] for k in ('is_last', 'is_terminal', 'reward')},
                imgret[:, 0].reshape((B, K)), training)
            losses.update(los)

        metrics.update({f'loss/{k}': v.mean() for k, v in losses.items()})
        loss = sum(v.mean() * self.scales[k] for k, v in losses.items())
        entries = {k: feat[k] for k in LATENT_KEYS}
        return loss, (dyncarry, entries, norms, metrics, losses)

    def _imag_loss(self, params, slowval, norms, inp, act, training):
        cfg, icfg = self.config, self.config.imag_loss
        norms = dict(norms)
        rew = self.rew(params['rew'], inp).pred()
        con = self.con(params['con'], inp).prob(1)
        policy = self.pol(params['pol'], inp)
        value = self.val(params['val'], inp)
        slowvalue = self.val(slowval, inp)

        voffset, vscale = self.valnorm.stats(norms['valnorm'])
        val = value.pred() * vscale + voffset
        slow = slowvalue.pred() * vscale + voffset
        tarval = slow if icfg.slowtar else val
        disc = 1.0 if cfg.contdisc else 1 - 1 / cfg.horizon
        weight = jnp.cumprod(disc * con, 1) / disc
        ret = returns.lambda_return(
            jnp.zeros_like(con), 1 - con, rew, tarval, disc, icfg.lam)

        if training:
            norms['retnorm'] = self.retnorm.update(norms['retnorm'], ret)
        roffset, rscale = self.retnorm.stats(norms['retnorm'])
        adv = (ret - tarval[:, :-1]) / rscale
        if training:
            norms['advnorm'] = self.advnorm.update(norms['advnorm'], adv)
        aoffset, ascale = self.advnorm.stats(norms['advnorm'])
        adv_normed = (adv - aoffset) / ascale
        logpi = sum(policy[k].logp(sg(act[k]))[:, :-1] for k in policy)
        ents = {k: policy[k].entropy()[:, :-1] for k in policy}
        losses = {}
        losses['policy'] = sg(weight[:, :-1]) * -(
            logpi * sg(adv_normed) + icfg.actent * sum(ents.values()))

        if training:
            norms['valnorm'] = self.valnorm.update(norms['valnorm'], ret)
        voffset, vscale = self.valnorm.stats(norms['valnorm'])
        target = (ret - voffset) / vscale
        target = jnp.concatenate([target, 0 * target[:, -1:]], 1)
        losses['value'] = sg(weight[:, :-1]) * (
            value.loss(sg(target)) +
            icfg.slowreg * value.loss(sg(slowvalue.pred())))[:, :-1]

        ret_normed = (ret - roffset) / rscale
        metrics = {
            'imag/adv': adv.mean(), 'imag/adv_std': adv.std(),
            'imag/rew': rew.mean(), 'imag/con': con.mean(),
            'imag/ret': ret_normed.mean(), 'imag/val': val.mean(),
            'imag/weight': weight.mean(), 'imag/slowval': slow.mean(),
            'imag/ret_rate': (jnp.abs(ret_normed) >= 1.0).mean(),
            'retnorm/scale': jnp.asarray(rscale, f32),
            'retnorm/offset': jnp.asarray(roffset, f32)}
        for k, dist in policy.items():
            metrics[f'ent/{k}'] = ents[k].mean()
            span = dist.maxent - dist.minent
            if span > 0:
                metrics[f'rand/{k}'] = (ents[k].mean() - dist.minent) / span
        return losses, ret, norms, metrics

    def _repl_loss(self, params, slowval, norms, inp, obs, boot, training):
        cfg, rcfg = self.config, self.config.repl_loss
        norms = dict(norms)
        value = self.val(params['val'], inp)
        slowvalue = self.val(slowval, inp)
        disc = 1 - 1 / cfg.horizon
        weight = (~obs['is_last']).astype(f32)
        ret = returns.lambda_return(
            obs['is_last'], obs['is_terminal'], obs['reward'].astype(f32),
            boot, disc, rcfg.lam)
        if training:
            norms['valnorm'] = self.valnorm.update(norms['valnorm'], ret)
        voffset, vscale = self.valnorm.stats(norms['valnorm'])
        target = (ret - voffset) / vscale
        target = jnp.concatenate([target, 0 * target[:, -1:]], 1)
        loss = weight[:, :-1] * (
            value.loss(sg(target)) +
            rcfg.slowreg * value.loss(sg(slowvalue.pred())))[:, :-1]
        return {'repval': loss}, norms


def _rms(tree):
    leaves = jax.tree.leaves(tree)
    total = sum(jnp.square(x.astype(f32)).sum() for x in leaves)
    count = sum(x.size for x in leaves)
    return jnp.sqrt(total / count)
