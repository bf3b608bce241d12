"""DreamerV3 (Hafner et al., Nature 2025), written from the paper on the
`embodied.jax` modules and agent base: `embodied.agents.dreamerv3:Agent`.

Modules: `rssm` (the recurrent state-space model, encoder and decoder),
`returns` (lambda-returns), `settings` (checks the `agent` config block),
`agent` (the losses and the agent).

The config keys are the original's `agent` block (configs/dreamerv3.yaml).
Values this implementation does not support raise `UnsupportedConfig`:
encoder/decoder types other than `simple`, dynamics other than `rssm`,
`policy_dist_disc` other than `categorical`, `policy_dist_cont` other than
`bounded_normal`, `report_gradnorms True`; `jax.compute_dtype float16` (it
would need loss scaling) raises in `embodied.jax`. Several hosts train one
agent as replicas (`jax.coordinator_address`, docs/hosts.md). Reports hold the world model's loss metrics (the
actor-critic's come with every update) and, as the original's do, an
open-loop video per image observation (`openloop/<key>`: truth, prediction
and error; `agent.report_openloop False` leaves them out).
"""

from .agent import Agent
from .settings import UnsupportedConfig

__all__ = ['Agent', 'UnsupportedConfig']
