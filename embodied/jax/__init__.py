"""The JAX agent base (jitted policy/train/report, devices, checkpoints) and
the original's module library on ninjax: `nets`, `outs`, heads, `opt` and the
`Normalize`/`SlowModel`/`LayerScan` helpers.

Importing this package imports JAX; environment workers never import it.
"""

from .agent import Agent
from .runtime import PlatformError, Runtime, setup
from .heads import DictHead, Head, MLPHead
from .opt import Optimizer
from .utils import LayerScan, Normalize, SlowModel
from . import nets
from . import opt
from . import outs

__all__ = [
    'Agent', 'PlatformError', 'Runtime', 'setup',
    'DictHead', 'Head', 'MLPHead', 'Optimizer', 'LayerScan', 'Normalize',
    'SlowModel', 'nets', 'opt', 'outs']
