"""Logger outputs of our own, for `elements.Logger` (see `embodied.factories.make_logger`).

`JSONLOutput` is elements' JSONL output plus a `time` column, which the plots
use for their wall-time axis. `TensorBoardOutput` writes event files with
tensorboardX, so TensorFlow is never needed. `WandBOutput` sends metrics to
a Weights & Biases run that a resumed run continues. `Logger` closes them.
"""

from .jsonl import JSONLOutput
from .logger import Logger
from .tensorboard import TensorBoardOutput
from .wandb import WandBOutput

__all__ = ['JSONLOutput', 'Logger', 'TensorBoardOutput', 'WandBOutput']
