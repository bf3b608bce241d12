"""What every runner shares around the agent's reports and metrics: the
report loop (`report_on`), closing a stream's read-ahead (`close_stream`)
and the shape of the metrics (`prefix`, `timer_metrics`)."""

import contextlib

import elements


def report_on(agent, stream, args, carry, lock=None):
    """Report metrics of the agent on `consec_report * report_batches`
    batches of `stream`; returns the new carry and the metrics (None when
    the stream ended first). Each `agent.report` runs under `lock` when one
    is given. The one report loop of every runner (the parallel learner
    passes its train lock and a fresh carry per report)."""
    agg = elements.Agg()
    for _ in range(args.consec_report * args.report_batches):
        batch = next(stream, None)
        if batch is None:
            return carry, None
        with lock or contextlib.nullcontext():
            carry, mets = agent.report(carry, batch)
        agg.add(mets)
    return carry, agg.result()


def close_stream(stream):
    """Closes a stream that can be closed (e.g. `agent.stream()`'s read-ahead
    thread); does nothing for others."""
    close = getattr(stream, 'close', None)
    if close:
        close()


def prefix(metrics, name):
    """`metrics` with keys `name/key`."""
    return {f'{name}/{k}': v for k, v in metrics.items()}


def timer_metrics(key):
    """`{key: the timer's text summary}`, or `{}` when nothing was timed
    since the last summary (`elements.timer.stats()` raises then, and an
    empty string cannot cross portal's wire format)."""
    timer = elements.timer.global_timer
    if not timer.enabled or not timer.paths:
        return {}
    summary = timer.stats()['summary']
    return {key: summary} if summary else {}
