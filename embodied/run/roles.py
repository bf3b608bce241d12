"""Moved to `embodied.run.parallel.roles`; this name still imports it."""

from embodied.run.parallel.roles import *  # noqa: F401,F403
