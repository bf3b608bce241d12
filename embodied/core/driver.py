"""Placeholder: being written."""
class Driver: pass
