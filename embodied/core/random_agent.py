"""Placeholder: being written."""
class RandomAgent: pass
