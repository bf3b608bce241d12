"""Helpers around `elements.timer` for the runners' metrics."""

import elements


def timer_summary():
    """The timer's text summary, or '' when nothing was timed yet
    (`elements.timer.stats()` raises in that case)."""
    timer = elements.timer.global_timer
    if not timer.enabled or not timer.paths:
        return ''
    return timer.stats()['summary']
