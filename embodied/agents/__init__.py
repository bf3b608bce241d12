"""Agents that ship with embodied. Each lives in its own module and is
imported only when selected (see `embodied.factories.make_agent`)."""
