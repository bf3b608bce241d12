"""Lambda-returns (the normalisers are `embodied.jax.Normalize`)."""

import jax.numpy as jnp

f32 = jnp.float32


def lambda_return(last, term, rew, boot, disc, lam):
    """TD(lambda) returns over (B, T) inputs; the result is (B, T - 1).

    rew[:, t] is the reward for arriving at step t and boot[:, t] the value
    estimate at step t. `term` ends the bootstrap (termination), `last` cuts
    the lambda mixing (the step ends a stored sequence).

    The recursion over time is a Python loop, unrolled into the program as
    in the original: each step is a few elementwise ops on a (B,) vector,
    which XLA fuses into straight-line kernels, where a `scan` would run a
    device loop of T tiny iterations (on a GPU each one launches its own
    kernels and checks the loop condition)."""
    live = (1 - term.astype(f32))[:, 1:] * disc
    cont = (1 - last.astype(f32))[:, 1:] * lam
    interm = rew[:, 1:] + (1 - cont) * live * boot[:, 1:]
    rets = [boot[:, -1]]
    for t in reversed(range(live.shape[1])):
        rets.append(interm[:, t] + live[:, t] * cont[:, t] * rets[-1])
    return jnp.stack(rets[::-1][:-1], 1)
