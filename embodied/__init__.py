"""embodied: a parallel actor-learner runner for world-model RL agents.

Importing `embodied` never imports JAX: environment worker processes import
this package, and JAX is only loaded by `embodied.jax` and the agents that
use it (reached lazily as `embodied.jax` / `embodied.agents`), and
`embodied.load_policy` (a trained agent in your script, `embodied.policy`)
imports it when called.
"""

import importlib

__version__ = '0.1.0'

from .core import *  # noqa: F401,F403
from . import envs  # noqa: F401
from . import outputs  # noqa: F401
from . import run  # noqa: F401

_LAZY = ('jax', 'agents', 'perf', 'plot', 'sweep')


def __getattr__(name):
    if name in _LAZY:
        return importlib.import_module(f'{__name__}.{name}')
    if name == 'load_policy':  # `embodied.policy.load_policy`
        return importlib.import_module(f'{__name__}.policy').load_policy
    raise AttributeError(f"module 'embodied' has no attribute '{name}'")
