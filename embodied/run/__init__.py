from .train import train
from .train_eval import train_eval
from .eval_only import eval_only
from . import parallel
