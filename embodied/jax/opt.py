"""The optimizer module and the gradient transformations DreamerV3 chains,
with the original `embodied.jax.opt` API."""

import math

import jax
import jax.numpy as jnp
import ninjax as nj
import optax

from . import nets
from . import utils

f32 = jnp.float32
i32 = jnp.int32
sg = jax.lax.stop_gradient


class Optimizer(nj.Module):
    """Differentiates a loss with respect to the parameters of `modules` and
    applies the optax transformation `opt` to them in place.

    `opt(lossfn, *args, has_aux=False, **kwargs)` returns a dict of metrics
    named '<optimizer name>/...' (and the loss function's aux output with
    `has_aux`). The loss must be a float32 scalar. Under a float16 compute
    dtype the loss is scaled dynamically and steps with non-finite gradients
    are skipped."""

    summary_depth: int = 2

    def __init__(self, modules, opt):
        self.modules = modules if isinstance(modules, (list, tuple)) else (
            modules,)
        self.opt = opt
        self.step = nj.Variable(jnp.array, 0, i32, name='step')
        self.scaling = nets.COMPUTE_DTYPE == jnp.float16
        if self.scaling:
            self.opt = optax.apply_if_finite(
                self.opt, max_consecutive_errors=1000)
            self.grad_scale = nj.Variable(
                jnp.array, 1e4, f32, name='grad_scale')
            self.good_steps = nj.Variable(jnp.array, 0, i32, name='good_steps')

    def __call__(self, lossfn, *args, has_aux=False, **kwargs):
        metrics = {}

        def scaled_loss(*args, **kwargs):
            result = lossfn(*args, **kwargs)
            loss, aux = result if has_aux else (result, None)
            if loss.dtype != f32 or loss.shape != ():
                raise ValueError(
                    f'Optimizer {self.name}: the loss must be a float32 '
                    f'scalar, got {loss.dtype} of shape {loss.shape}.')
            if self.scaling:
                loss = loss * sg(self.grad_scale.read())
            return loss, aux

        if nj.creating() and nj.context().ignore:
            return self._init_entries(scaled_loss, args, kwargs, has_aux)
        else:
            loss, params, grads, aux = nj.grad(
                scaled_loss, self.modules, has_aux=True)(*args, **kwargs)
        if self.scaling:
            loss = loss / self.grad_scale.read()

        counts = self._count(params)

        axes = utils.get_data_axes()
        if axes:
            grads = jax.tree.map(lambda x: jax.lax.pmean(x, axes), grads)
        if self.scaling:
            inverse = 1 / self.grad_scale.read()
            grads = jax.tree.map(lambda x: x * inverse, grads)

        state = self.sub('state', nj.Tree, self.opt.init, params)
        updates, new_state = self.opt.update(grads, state.read(), params)
        nj.context().update(optax.apply_updates(params, updates))
        state.write(new_state)

        grad_norm = optax.global_norm(grads)
        if self.scaling:
            finite = jnp.isfinite(grad_norm)
            self._update_scale(finite)
            grad_norm = jnp.where(finite, grad_norm, jnp.nan)
            self.step.write(self.step.read() + i32(finite))
            metrics['grad_scale'] = self.grad_scale.read()
            metrics['grad_overflow'] = f32(~finite)
        else:
            self.step.write(self.step.read() + 1)
        metrics['loss'] = loss.mean()
        metrics['updates'] = self.step.read()
        metrics['grad_norm'] = grad_norm
        metrics['grad_rms'] = nets.rms(grads)
        metrics['update_rms'] = nets.rms(updates)
        metrics['param_rms'] = nets.rms([m.values for m in self.modules])
        metrics['param_count'] = jnp.array(list(counts.values()), f32).sum()
        metrics = {f'{self.name}/{k}': v for k, v in metrics.items()}
        return (metrics, aux) if has_aux else metrics

    def _init_entries(self, scaled_loss, args, kwargs, has_aux):
        """The agent's init (create and ignore): creates the parameters,
        the optimizer's state and counters, and nothing else. The update
        is not traced: its writes would be ignored and its metrics are not
        read (it was about a fifth of the init's trace at `debug`)."""
        params, aux = self._create(scaled_loss, *args, **kwargs)
        self._count(params)
        self.sub('state', nj.Tree, self.opt.init, params).read()
        self.step.read()
        if self.scaling:
            self.grad_scale.read()
            self.good_steps.read()
        return ({}, aux) if has_aux else {}

    def _create(self, lossfn, *args, **kwargs):
        """The parameters and aux of `nj.grad`, in a trace that keeps only
        the entries it creates (create and ignore: the agent's init). The
        loss's forward pass creates the parameters as `nj.grad`'s first
        pass does, drawing the same seeds in the same order, so they come
        out the same. The trace skips the second forward and the backward
        pass (half the init's trace)."""
        pure = nj.pure(lossfn, nested=True)
        args, kwargs = jax.tree.map(lambda x: x, (args, kwargs))
        state, (_, aux), accessed, _, created = pure(
            dict(nj.context()), *args, ignore=True, track=True,
            seed=nj.seed(None, True), **kwargs)
        nj.context().update({k: v for k, v in state.items() if k in created})
        nj.seed(None, True)  # The seed of nj.grad's second pass.
        prefixes = tuple(module.path + '/' for module in self.modules)
        params = {k: nj.context()[k] for k in nj.context()
                  if k.startswith(prefixes) and k in accessed}
        return params, aux

    def _count(self, params):
        """Parameter counts by name; printed as a summary while creating."""
        counts = {k: math.prod(v.shape) for k, v in params.items()}
        if nj.creating():
            print(self._summarize_params(counts, self.summary_depth))
        return counts

    def _update_scale(self, finite):
        # After 1000 finite steps in a row the scale doubles; a non-finite
        # step halves it and restarts the count.
        good = self.good_steps.read()
        scale = self.grad_scale.read()
        keep = finite & (good < 1000)
        grow = finite & (good >= 1000)
        self.good_steps.write(i32(keep) * (good + 1))
        scale = jnp.where(grow, 2 * scale, jnp.where(finite, scale, scale / 2))
        self.grad_scale.write(jnp.clip(scale, 1e-4, 1e5))
        return finite

    def _summarize_params(self, counts, depth):
        totals = {}
        for key, count in counts.items():
            parts = key.split('/')
            for i in range(min(len(parts), depth)):
                prefix = '/'.join(parts[:i + 1])
                totals[prefix] = totals.get(prefix, 0) + count
        lines = [f'Optimizer {self.name} has {sum(counts.values()):,} params:']
        for prefix, count in sorted(totals.items(), key=lambda x: -x[1]):
            lines.append(f'{count:>14,} {prefix}')
        return '\n'.join(lines)


def clip_by_agc(clip=0.3, pmin=1e-3):
    """Adaptive gradient clipping per tensor: scales each update down so its
    norm is at most `clip` times its parameter's norm (at least `pmin`).
    `clip=0` disables it."""

    def init_fn(params):
        return ()

    def update_fn(updates, state, params=None):
        if not clip:
            return updates, ()
        if params is None:
            raise ValueError('clip_by_agc needs the params in update().')

        def fn(param, update):
            unorm = jnp.linalg.norm(update.reshape(-1), 2)
            pnorm = jnp.linalg.norm(param.reshape(-1), 2)
            upper = clip * jnp.maximum(pmin, pnorm)
            return update * (1 / jnp.maximum(1.0, unorm / upper))

        return jax.tree.map(fn, params, updates), ()

    return optax.GradientTransformation(init_fn, update_fn)


def _debias(moment, beta, step):
    correction = 1 - beta ** step.astype(f32)
    return jax.tree.map(lambda x: x / correction.astype(x.dtype), moment)


def _increment(step):
    return jnp.where(step < jnp.iinfo(i32).max, step + 1, step)


def _step_and_zeros(params):
    # The state of a debiased moving average: its step and an f32 zero per
    # parameter.
    return (jnp.zeros((), i32), jax.tree.map(
        lambda x: jnp.zeros_like(x, f32), params))


def scale_by_rms(beta=0.999, eps=1e-8):
    """Divides updates by the root of a debiased moving average of their
    squares (plus `eps`); with momentum after it, this is LaProp."""

    def update_fn(updates, state, params=None):
        step, nu = state
        step = _increment(step)
        nu = jax.tree.map(
            lambda v, u: beta * v + (1 - beta) * (u * u), nu, updates)
        nu_hat = _debias(nu, beta, step)
        updates = jax.tree.map(
            lambda u, v: u / (jnp.sqrt(v) + eps), updates, nu_hat)
        return updates, (step, nu)

    return optax.GradientTransformation(_step_and_zeros, update_fn)


def scale_by_momentum(beta=0.9, nesterov=False):
    """Replaces updates by their debiased moving average (Nesterov style:
    the average one step ahead)."""

    def update_fn(updates, state, params=None):
        step, mu = state
        step = _increment(step)
        ema = lambda m: jax.tree.map(
            lambda m, u: beta * m + (1 - beta) * u, m, updates)
        mu = ema(mu)
        mu_hat = _debias(ema(mu) if nesterov else mu, beta, step)
        return mu_hat, (step, mu)

    return optax.GradientTransformation(_step_and_zeros, update_fn)
