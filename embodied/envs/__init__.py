"""Environments. Suites are imported lazily by `embodied.envs.registry`."""
