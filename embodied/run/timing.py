"""Helpers around `elements.timer` for the runners' metrics."""

import elements


def timer_metrics(key):
    """`{key: the timer's text summary}`, or `{}` when nothing was timed
    since the last summary (`elements.timer.stats()` raises then, and an
    empty string cannot cross portal's wire format)."""
    timer = elements.timer.global_timer
    if not timer.enabled or not timer.paths:
        return {}
    summary = timer.stats()['summary']
    return {key: summary} if summary else {}
