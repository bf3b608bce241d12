"""The runners: single-process scripts and the parallel runner.

`parallel` is imported on first use, so that `python -m embodied.run.parallel`
does not find the module already imported under its own name.
"""

import importlib

from .train import train
from .train_eval import train_eval
from .eval_only import eval_only


def __getattr__(name):
    if name == 'parallel':
        return importlib.import_module(f'{__name__}.parallel')
    raise AttributeError(f"module 'embodied.run' has no attribute '{name}'")
