"""Lambda-returns (the normalisers are `embodied.jax.Normalize`)."""

import jax
import jax.numpy as jnp

f32 = jnp.float32
sg = jax.lax.stop_gradient


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
