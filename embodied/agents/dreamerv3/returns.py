"""Lambda-returns and the EMA normalisers of returns, values and advantages."""

import jax
import jax.numpy as jnp

f32 = jnp.float32
sg = jax.lax.stop_gradient

NORM_IMPLS = ('perc', 'meanstd', 'none')


def lambda_return(last, term, rew, boot, disc, lam):
    """TD(lambda) returns over (B, T) inputs; the result is (B, T - 1).

    rew[:, t] is the reward for arriving at step t and boot[:, t] the value
    estimate at step t. `term` ends the bootstrap (termination), `last` cuts
    the lambda mixing (the step ends a stored sequence)."""
    live = (1 - term.astype(f32))[:, 1:] * disc
    cont = (1 - last.astype(f32))[:, 1:] * lam
    interm = rew[:, 1:] + (1 - cont) * live * boot[:, 1:]

    def step(ret, inputs):
        interm_t, live_t, cont_t = inputs
        ret = interm_t + live_t * cont_t * ret
        return ret, ret

    swap = lambda x: jnp.swapaxes(x, 0, 1)
    _, rets = jax.lax.scan(
        step, boot[:, -1], (swap(interm), swap(live), swap(cont)),
        reverse=True)
    return swap(rets)


class Normalize:
    """EMA statistics of a quantity for normalising it: `perc` tracks the 5th
    and 95th percentiles (the scale is their distance, at least `limit`),
    `meanstd` the mean and standard deviation, `none` nothing."""

    def __init__(self, impl='perc', rate=0.01, limit=1.0, perclo=5.0,
                 perchi=95.0, debias=False):
        if impl not in NORM_IMPLS:
            raise ValueError(
                f"Unsupported normaliser impl '{impl}'; choose one of "
                f"{', '.join(NORM_IMPLS)}.")
        self.impl, self.rate, self.limit = impl, rate, limit
        self.perclo, self.perchi, self.debias = perclo, perchi, debias

    def init(self):
        if self.impl == 'none':
            return {}
        names = ('lo', 'hi') if self.impl == 'perc' else ('mean', 'sqrs')
        state = {n: jnp.zeros((), f32) for n in names}
        if self.debias:
            state['corr'] = jnp.zeros((), f32)
        return state

    def update(self, state, x):
        if self.impl == 'none':
            return state
        x = sg(x.astype(f32))
        if self.impl == 'perc':
            new = {
                'lo': jnp.percentile(x, self.perclo),
                'hi': jnp.percentile(x, self.perchi)}
        else:
            new = {'mean': x.mean(), 'sqrs': jnp.square(x).mean()}
        if self.debias:
            new['corr'] = jnp.ones((), f32)
        return {
            k: (1 - self.rate) * state[k] + self.rate * new[k] for k in state}

    def stats(self, state):
        """(offset, scale) to normalise with: (x - offset) / scale."""
        if self.impl == 'none':
            return 0.0, 1.0
        corr = 1.0
        if self.debias:
            corr = 1.0 / jnp.maximum(self.rate, state['corr'])
        if self.impl == 'perc':
            lo, hi = state['lo'] * corr, state['hi'] * corr
            return sg(lo), sg(jnp.maximum(self.limit, hi - lo))
        mean = state['mean'] * corr
        std = jnp.sqrt(jax.nn.relu(state['sqrs'] * corr - mean ** 2))
        return sg(mean), sg(jnp.maximum(self.limit, std))
