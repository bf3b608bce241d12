from .base import Agent, Env, Wrapper, Stream, Space
from .clock import LocalClock, GlobalClock
from .checkpoint import Checkpoint
from .driver import Driver
from .random_agent import RandomAgent
from .replay import Replay

from . import checkpoint
from . import checks
from . import clock
from . import limiters
from . import replay
from . import selectors
from . import streams
from . import wrappers
