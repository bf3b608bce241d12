"""The DreamerV3 agent (Hafner et al., Nature 2025) on the JAX agent base."""

import embodied.jax

from .model import DreamerModel


class Agent(embodied.jax.Agent):
    """DreamerV3: `Agent(obs_space, act_space, config)` where `config` holds
    the `agent` block plus `jax`, `seed`, `logdir`, `replay_context` and the
    batch settings (see `embodied.main.make_agent`)."""

    banner = [
        '--- DreamerV3 (embodied) ---',
    ]

    def make_model(self, obs_space, act_space, config, compute_dtype):
        return DreamerModel(obs_space, act_space, config, compute_dtype)
