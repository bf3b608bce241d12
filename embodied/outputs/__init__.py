"""Logger outputs of our own, for `elements.Logger` (see `embodied.factories.make_logger`).

`JSONLOutput` is elements' JSONL output plus a `time` column, which the plots
use for their wall-time axis. `TensorBoardOutput` writes event files with
tensorboardX, so TensorFlow is never needed.
"""

from .jsonl import JSONLOutput
from .tensorboard import TensorBoardOutput

__all__ = ['JSONLOutput', 'TensorBoardOutput']
