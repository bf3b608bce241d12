"""The DreamerV3 optimizer as a chain of optax gradient transformations:
adaptive gradient clipping, LaProp (normalise by the RMS first, then apply
momentum), optional weight decay and a learning-rate schedule with warmup."""

import re

import jax
import jax.numpy as jnp
import optax

SCHEDULES = ('const', 'linear', 'cosine')


def clip_by_agc(clip=0.3, pmin=1e-3):
    """Scales each parameter's update so its norm is at most `clip` times the
    parameter's norm (at least `pmin`). Per tensor, as in DreamerV3; optax's
    `adaptive_grad_clip` clips per output unit instead."""

    def init_fn(params):
        del params
        return optax.EmptyState()

    def update_fn(updates, state, params=None):
        if params is None:
            raise ValueError('clip_by_agc needs the params.')

        def clip_one(update, param):
            unorm = jnp.linalg.norm(update.reshape(-1))
            pnorm = jnp.linalg.norm(param.reshape(-1))
            upper = clip * jnp.maximum(pmin, pnorm)
            return update / jnp.maximum(1.0, unorm / upper)

        if clip:
            updates = jax.tree.map(clip_one, updates, params)
        return updates, state

    return optax.GradientTransformation(init_fn, update_fn)


def make_optimizer(
        lr=4e-5, agc=0.3, eps=1e-20, beta1=0.9, beta2=0.999, momentum=True,
        wd=0.0, wdregex=r'/kernel$', schedule='const', warmup=1000, anneal=0):
    """Builds the optimizer from the original's `opt` config keys."""
    if schedule not in SCHEDULES:
        raise ValueError(
            f"Unsupported opt.schedule '{schedule}'; choose one of "
            f"{', '.join(SCHEDULES)}.")
    if schedule != 'const' and anneal <= warmup:
        raise ValueError(
            f"opt.schedule '{schedule}' needs opt.anneal > opt.warmup "
            f"(got anneal {anneal}, warmup {warmup}).")
    chain = [
        clip_by_agc(agc),
        optax.scale_by_rms(beta2, eps, eps_in_sqrt=False, bias_correction=True),
    ]
    if momentum:
        chain.append(optax.ema(beta1, debias=True))
    if wd:
        pattern = re.compile(wdregex)
        chain.append(optax.add_decayed_weights(wd, lambda params: _mask(
            params, pattern)))
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


def _mask(params, pattern):
    from .tree import path_str
    return jax.tree_util.tree_map_with_path(
        lambda path, _: bool(pattern.search('/' + path_str(path))), params)
