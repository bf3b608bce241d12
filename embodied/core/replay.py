"""Placeholder: being written."""
class Replay: pass
