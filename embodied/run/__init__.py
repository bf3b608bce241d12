"""The runners: single-process scripts and the parallel runner.

`parallel` (a package, one module per role) is imported on first use: the
single-process scripts need none of its RPC machinery.
"""

import importlib

from .train import train
from .train_eval import train_eval
from .eval_only import eval_only


def __getattr__(name):
    if name == 'parallel':
        return importlib.import_module(f'{__name__}.parallel')
    raise AttributeError(f"module 'embodied.run' has no attribute '{name}'")
