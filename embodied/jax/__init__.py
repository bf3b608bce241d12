"""The JAX agent base: jitted policy/train/report, devices, checkpoints.

Importing this package imports JAX; environment workers never import it.
"""

from .agent import Agent, Model
from .runtime import PlatformError, Runtime, setup
from . import nets
from . import opt
from . import outs
from . import tree

__all__ = [
    'Agent', 'Model', 'PlatformError', 'Runtime', 'setup',
    'nets', 'opt', 'outs', 'tree']
