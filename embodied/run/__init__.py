"""The runners: single-process scripts and the parallel runner.

`parallel` (a package, one module per role) is imported on first use: the
single-process scripts need none of its RPC machinery. `clock_server`
connects the replicas of `embodied.clock.setup`; it is installed in
`core/clock.py` here, since core does not import the runners.
"""

import importlib

from embodied.core import clock as _clock

from . import clock_server
from .train import train
from .train_eval import train_eval
from .eval_only import eval_only

_clock.connect_with(clock_server.connect)  # For `embodied.clock.setup`.


def __getattr__(name):
    if name == 'parallel':
        return importlib.import_module(f'{__name__}.parallel')
    raise AttributeError(f"module 'embodied.run' has no attribute '{name}'")
