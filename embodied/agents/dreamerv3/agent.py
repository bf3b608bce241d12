"""The DreamerV3 agent (Hafner et al., Nature 2025) on `embodied.jax`: a world
model (encoder, RSSM, decoder, reward and continuation heads), an
actor-critic trained in imagination, and a value loss on replayed
sequences, all trained together by one optimizer."""

import re

import elements
import jax
import jax.numpy as jnp
import ninjax as nj
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

import embodied.jax
from embodied.jax import nets

from . import returns, settings, spaces
from .rssm import RSSM, Decoder, Encoder

f32 = jnp.float32
sg = jax.lax.stop_gradient
LATENT_KEYS = ('deter', 'stoch')
SIGNAL_KEYS = ('is_first', 'is_last', 'is_terminal', 'reward')
OPENLOOP_SEQUENCES = 6  # The original's: sequences in an open-loop video.


def sample(dists):
    return {k: dists[k].sample(nj.seed()) for k in sorted(dists)}


def flat_feat(feat):
    """The latent state as one vector per step in the compute dtype, the
    networks' input (each part cast before they are joined: the same
    values as joining first, without a float32 copy of the whole)."""
    stoch = feat['stoch'].reshape((*feat['stoch'].shape[:-2], -1))
    return jnp.concatenate([nets.cast(feat['deter']), nets.cast(stoch)], -1)


class Agent(embodied.jax.Agent):
    """DreamerV3: `Agent(obs_space, act_space, config)` where `config` holds
    the `agent` block plus `jax`, `seed`, `logdir`, `replay_context` and the
    batch settings (see `embodied.factories.make_agent`)."""

    banner = [
        '--- DreamerV3 (embodied) ---',
    ]

    def __init__(self, obs_space, act_space, config):
        self.check_spaces(obs_space, act_space, config)
        self.obs_space = obs_space
        self.act_space = act_space
        self.config = config
        missing = [k for k in SIGNAL_KEYS if k not in obs_space]
        if missing:
            raise ValueError(f'Observation space lacks {missing}.')
        self.dec_space = {
            k: v for k, v in obs_space.items() if k not in SIGNAL_KEYS}
        self.enc = Encoder(self.dec_space, **config.enc.simple, name='enc')
        self.dyn = RSSM(act_space, **config.dyn.rssm, name='dyn')
        self.dec = Decoder(self.dec_space, **config.dec.simple, name='dec')
        scalar = elements.Space(np.float32, ())
        binary = elements.Space(bool, (), 0, 2)
        self.rew = embodied.jax.MLPHead(scalar, **config.rewhead, name='rew')
        self.con = embodied.jax.MLPHead(binary, **config.conhead, name='con')
        outputs = {
            k: config.policy_dist_disc if s.discrete else config.policy_dist_cont
            for k, s in act_space.items()}
        self.pol = embodied.jax.MLPHead(
            act_space, outputs, **config.policy, name='pol')
        self.val = embodied.jax.MLPHead(scalar, **config.value, name='val')
        self.slowval = embodied.jax.SlowModel(
            embodied.jax.MLPHead(scalar, **config.value, name='slowval'),
            source=self.val, **config.slowvalue)
        self.retnorm = embodied.jax.Normalize(**config.retnorm, name='retnorm')
        self.valnorm = embodied.jax.Normalize(**config.valnorm, name='valnorm')
        self.advnorm = embodied.jax.Normalize(**config.advnorm, name='advnorm')
        self.modules = [
            self.enc, self.dyn, self.dec, self.rew, self.con, self.pol,
            self.val]
        self.opt = embodied.jax.Optimizer(
            self.modules, make_opt(**config.opt), summary_depth=1, name='opt')
        scales = dict(config.loss_scales)
        rec = scales.pop('rec')
        scales.update({k: rec for k in self.dec_space})
        if not config.repval_loss:
            scales.pop('repval')
        self.scales = scales

    @staticmethod
    def check_spaces(obs_space, act_space, config):
        """Raises a ValueError of one line unless DreamerV3 can be built
        with `config` (its agent config) for these spaces: the settings it
        implements (`settings.check`, an `UnsupportedConfig`) and the
        spaces its networks take (`spaces.check`). The run calls it at the
        start, before any worker starts (`factories.check_agent`)."""
        settings.check(config)
        spaces.check(obs_space, act_space, config)

    @property
    def policy_keys(self):
        return '^(enc|dyn|pol)/'

    # How the kernels and their optimizer moments (whose names end in the
    # kernel's) lie on the mesh (embodied/jax/sharding.py): the input
    # features split over 'f' (FSDP: each device stores 1/f), the outputs
    # over 't' (tensor parallel: each device computes its part of the
    # matmul). The block-diagonal layers of the RSSM and the decoder's
    # spatial projection split their blocks over 't'. An axis that does not
    # divide a dimension is dropped for that kernel; biases, norms and
    # statistics are replicated. Activations stay split over the batch.
    partition_rules = (
        [
            (r'(enc|dec)/(conv\d+|imgout)/kernel$',
             P(None, None, 'f', 't')),
            (r'(dyn/(dynhid\d+|dyngru)|dec/sp0)/kernel$', P('t', 'f')),
            (r'kernel$', P('f', 't')),
            (r'.*', P()),
        ],
        [
            (r'/out$', P(('d', 'f'))),
        ],
    )

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

    def init_policy(self, batch_size):
        prevact = {
            k: jnp.zeros((batch_size, *s.shape), s.dtype)
            for k, s in self.act_space.items()}
        return {'dyn': self.dyn.initial(batch_size), 'prevact': prevact}

    def init_train(self, batch_size):
        return self.init_policy(batch_size)

    def init_report(self, batch_size):
        return self.init_policy(batch_size)

    def policy(self, carry, obs, mode='train'):
        tokens = self.enc(obs)
        dyncarry, feat = self.dyn.observe_step(
            carry['dyn'], tokens, carry['prevact'], obs['is_first'])
        act = sample(self.pol(flat_feat(feat), 1))
        out = {}
        if self.config.replay_context:
            out = {f'dyn/{k}': dyncarry[k] for k in LATENT_KEYS}
        return {'dyn': dyncarry, 'prevact': act}, act, out

    def train(self, carry, data):
        start, obs, prevact, stepid = self._apply_context(carry, data)
        metrics, (dyncarry, entries, mets) = self.opt(
            self.loss, start, obs, prevact, training=True, has_aux=True)
        metrics.update(mets)
        self.slowval.update()
        outs = {}
        if self.config.replay_context and stepid is not None:
            outs['replay'] = {
                'stepid': stepid,
                **{f'dyn/{k}': entries[k] for k in LATENT_KEYS}}
        carry = {
            'dyn': dyncarry,
            'prevact': {k: data[k][:, -1] for k in self.act_space}}
        return carry, outs, metrics

    def report(self, carry, data):
        """The world model's losses and metrics on a report batch
        ('loss/<name>' for the reconstructions, reward, continuation and the
        KL terms) and, with `report_openloop`, the original's open-loop
        videos of each image key ('openloop/<key>', see `openloop_video`).
        The actor-critic's losses, which come from imagination, are left to
        `train`, whose metrics give them every update: imagining from every
        report state would make the report program about as large as the
        update's forward pass, at shapes the update does not share (a
        separate set of matmuls for the GPU compiler to tune)."""
        if not self.config.report:
            return carry, {}
        start, obs, prevact, _ = self._apply_context(carry, data)
        losses, metrics, dyncarry, feat = self._world_model(
            start, obs, prevact)
        metrics.update({f'loss/{k}': v.mean() for k, v in losses.items()})
        if self.config.report_openloop:
            metrics.update(self._openloop(feat, obs, prevact))
        carry = {
            'dyn': dyncarry,
            'prevact': {k: data[k][:, -1] for k in self.act_space}}
        return carry, metrics

    def loss(self, start, obs, prevact, training):
        """Returns (loss, (carry, latent entries, metrics)); the metrics
        hold each loss's mean as 'loss/<name>'."""
        losses, metrics, carry, entries = self.losses(
            start, obs, prevact, training)
        metrics.update({f'loss/{k}': v.mean() for k, v in losses.items()})
        loss = sum(v.mean() * self.scales[k] for k, v in losses.items())
        return loss, (carry, entries, metrics)

    def losses(self, start, obs, prevact, training):
        """(losses, metrics, carry, latent entries): each unscaled loss per
        example and step."""
        cfg = self.config
        B, T = obs['is_first'].shape
        losses, metrics, dyncarry, feat = self._world_model(start, obs, prevact)
        featvec = flat_feat(feat)

        # Imagination from the last K replayed states
        K = min(cfg.imag_last or T, T)
        H = cfg.imag_length
        starts = {
            k: sg(feat[k][:, -K:]).reshape((B * K, *feat[k].shape[2:]))
            for k in LATENT_KEYS}
        policyfn = lambda f: sample(self.pol(sg(flat_feat(f)), 1))
        _, imgfeat, imgact = self.dyn.imagine(starts, policyfn, H)
        first = {
            k: feat[k][:, -K:].reshape((B * K, 1, *feat[k].shape[2:]))
            for k in LATENT_KEYS}
        first = first if cfg.ac_grads else sg(first)
        imgfeat = {
            k: jnp.concatenate([first[k], sg(imgfeat[k])], 1)
            for k in LATENT_KEYS}
        lastact = policyfn({k: v[:, -1] for k, v in imgfeat.items()})
        imgact = {
            k: jnp.concatenate([imgact[k], lastact[k][:, None]], 1)
            for k in self.act_space}
        los, imgret, mets = self._imag_loss(
            flat_feat(imgfeat), imgact, training)
        losses.update({k: v.mean(1).reshape((B, K)) for k, v in los.items()})
        metrics.update(mets)

        # Replay value loss, bootstrapped from the imagined returns
        if cfg.repval_loss:
            repinp = featvec if cfg.repval_grad else sg(featvec)
            losses['repval'] = self._repl_loss(
                repinp[:, -K:],
                {k: obs[k][:, -K:] for k in ('is_last', 'is_terminal', 'reward')},
                imgret[:, 0].reshape((B, K)), training)

        entries = {k: feat[k] for k in LATENT_KEYS}
        return losses, metrics, dyncarry, entries

    def _world_model(self, start, obs, prevact):
        """(losses, metrics, carry, feat) of the world model on a replayed
        sequence: the KL terms, reconstructions, reward and continuation."""
        cfg = self.config
        losses, metrics = {}, {}
        tokens = self.enc(obs)
        dyncarry, feat = self.dyn.observe(
            start, tokens, prevact, obs['is_first'])
        kl, mets = self.dyn.kl_losses(feat)
        losses.update(kl)
        metrics.update(mets)
        for key, dist in self.dec(feat).items():
            target = obs[key]
            if len(self.obs_space[key].shape) == 3:
                target = target.astype(f32) / 255
            elif not self.dec.vecspaces[key].discrete:
                target = target.astype(f32)
            losses[key] = dist.loss(target)
        featvec = flat_feat(feat)
        rewinp = featvec if cfg.reward_grad else sg(featvec)
        losses['rew'] = self.rew(rewinp, 2).loss(obs['reward'])
        con = (~obs['is_terminal']).astype(f32)
        if cfg.contdisc:
            con *= 1 - 1 / cfg.horizon
        losses['con'] = self.con(featvec, 2).loss(con)
        return losses, metrics, dyncarry, feat

    def _openloop(self, feat, obs, prevact):
        """{'openloop/<key>': video} for each image key: the first
        OPENLOOP_SEQUENCES sequences of the batch, observed for their first
        half (the report's posterior states) and imagined for the second
        half from the replayed actions alone, then decoded."""
        B, T = obs['is_first'].shape
        if not self.dec.imgkeys or T < 2:
            return {}
        R, half = min(OPENLOOP_SEQUENCES, B), T // 2

        def step(carry, action):
            return self.dyn.imagine_step(carry, action)
        last = {k: feat[k][:R, half - 1] for k in LATENT_KEYS}
        actions = {k: v[:R, half:] for k, v in prevact.items()}
        _, imagined = nj.scan(step, last, actions, axis=1)
        both = {
            k: jnp.concatenate([feat[k][:R, :half], imagined[k]], 1)
            for k in LATENT_KEYS}
        dists = self.dec(both)
        return {
            f'openloop/{key}': openloop_video(
                obs[key][:R], dists[key].pred(), half)
            for key in self.dec.imgkeys}

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
        start = nets.where(first, stored, carry['dyn'])
        return start, obs, prevact, stepid

    def _imag_loss(self, inp, act, training):
        cfg, icfg = self.config, self.config.imag_loss
        rew = self.rew(inp, 2).pred()
        con = self.con(inp, 2).prob(1)
        policy = self.pol(inp, 2)
        value = self.val(inp, 2)
        slowvalue = self.slowval(inp, 2)

        voffset, vscale = self.valnorm.stats()
        val = value.pred() * vscale + voffset
        slow = slowvalue.pred() * vscale + voffset
        tarval = slow if icfg.slowtar else val
        disc = 1.0 if cfg.contdisc else 1 - 1 / cfg.horizon
        weight = jnp.cumprod(disc * con, 1) / disc
        ret = returns.lambda_return(
            jnp.zeros_like(con), 1 - con, rew, tarval, disc, icfg.lam)

        roffset, rscale = self.retnorm(ret, training)
        adv = (ret - tarval[:, :-1]) / rscale
        aoffset, ascale = self.advnorm(adv, training)
        adv_normed = (adv - aoffset) / ascale
        logpi = sum(policy[k].logp(sg(act[k]))[:, :-1] for k in policy)
        ents = {k: policy[k].entropy()[:, :-1] for k in policy}
        losses = {}
        losses['policy'] = sg(weight[:, :-1]) * -(
            logpi * sg(adv_normed) + icfg.actent * sum(ents.values()))

        voffset, vscale = self.valnorm(ret, training)
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
            lo, hi = getattr(dist, 'minent', None), getattr(dist, 'maxent', None)
            if lo is not None and hi is not None:
                metrics[f'rand/{k}'] = (ents[k].mean() - lo) / (hi - lo)
        return losses, ret, metrics

    def _repl_loss(self, inp, obs, boot, training):
        cfg, rcfg = self.config, self.config.repl_loss
        value = self.val(inp, 2)
        slowvalue = self.slowval(inp, 2)
        disc = 1 - 1 / cfg.horizon
        weight = (~obs['is_last']).astype(f32)
        ret = returns.lambda_return(
            obs['is_last'], obs['is_terminal'], obs['reward'].astype(f32),
            boot, disc, rcfg.lam)
        voffset, vscale = self.valnorm(ret, training)
        target = (ret - voffset) / vscale
        target = jnp.concatenate([target, 0 * target[:, -1:]], 1)
        return weight[:, :-1] * (
            value.loss(sg(target)) +
            rcfg.slowreg * value.loss(sg(slowvalue.pred())))[:, :-1]


def openloop_video(true, pred, observed):
    """The original's open-loop grid from the true images (B, T, H, W, C)
    uint8 and the predicted ones in [0, 1], of which the first `observed`
    steps were observed: each sequence's frame stacks truth, prediction and
    error ((pred - true + 255) / 2, gray where they agree) from top to
    bottom inside a 2-pixel frame, green while observed and red while
    imagined; the sequences stand side by side and 10 black frames end the
    clip. Returns (T + 10, 3H + 4, B (W + 4), 3 or C) uint8."""
    T = true.shape[1]
    pred = jnp.clip(pred * 255, 0, 255).astype(jnp.uint8)
    error = ((pred.astype(jnp.int32) - true.astype(jnp.int32) + 255) / 2)
    video = jnp.concatenate([true, pred, error.astype(jnp.uint8)], 2)
    video = jnp.pad(video, [(0, 0), (0, 0), (2, 2), (2, 2), (0, 0)])
    inside = jnp.zeros(video.shape[2:4], bool).at[2:-2, 2:-2].set(True)
    colors = jnp.where(
        (jnp.arange(T) < observed)[:, None],
        jnp.array([0, 255, 0], jnp.uint8), jnp.array([255, 0, 0], jnp.uint8))
    video = jnp.where(
        inside[None, None, :, :, None], video, colors[None, :, None, None, :])
    video = jnp.concatenate([video, jnp.zeros_like(video[:, :10])], 1)
    B, T, H, W, C = video.shape
    return video.transpose((1, 2, 0, 3, 4)).reshape((T, H, B * W, C))


def make_opt(
        lr=4e-5, agc=0.3, eps=1e-20, beta1=0.9, beta2=0.999, momentum=True,
        wd=0.0, wdregex=r'/kernel$', schedule='const', warmup=1000, anneal=0):
    """The optimizer from the original's `opt` keys: adaptive gradient
    clipping, LaProp (RMS scaling, then momentum), optional weight decay on
    the parameters whose names match `wdregex`, and a learning-rate schedule
    with linear warmup."""
    if schedule not in settings.SCHEDULES:
        raise settings.UnsupportedConfig(
            f"agent.opt.schedule is {schedule!r}; supported: "
            f"{', '.join(settings.SCHEDULES)}")
    if schedule != 'const' and anneal <= warmup:
        raise settings.UnsupportedConfig(
            f"agent.opt.schedule '{schedule}' needs opt.anneal > opt.warmup "
            f"(got anneal {anneal}, warmup {warmup}).")
    chain = [
        embodied.jax.opt.clip_by_agc(agc),
        embodied.jax.opt.scale_by_rms(beta2, eps)]
    if momentum:
        chain.append(embodied.jax.opt.scale_by_momentum(beta1))
    if wd:
        pattern = re.compile(wdregex)
        chain.append(optax.add_decayed_weights(
            wd, lambda params: {k: bool(pattern.search(k)) for k in params}))
    if schedule == 'const':
        sched = optax.constant_schedule(lr)
    elif schedule == 'linear':
        sched = optax.linear_schedule(lr, 0.1 * lr, anneal - warmup)
    else:
        sched = optax.cosine_decay_schedule(lr, anneal - warmup, 0.1)
    if warmup:
        ramp = optax.linear_schedule(0.0, lr, warmup)
        sched = optax.join_schedules([ramp, sched], [warmup])
    chain.append(optax.scale_by_learning_rate(sched))
    return optax.chain(*chain)
