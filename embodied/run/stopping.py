"""When a run stops: SIGTERM / SIGINT, and a stdout or stderr that lost its
reader, become a request to stop at the next safe point (`StopSignal`),
and one rule, `stop_reason`, that the single-process scripts (`loop.Loop`)
and the parallel launcher share."""

import signal
import sys
import threading
import time

from embodied.core import broken_streams


class StopSignal:
    """Context manager: while active, SIGTERM and SIGINT set `self.event`
    instead of killing the process, so a loop can save and exit cleanly.

        with StopSignal() as stop:
            while not stop.requested and step < steps:
                ...
        # final save here

    SIGTERM only ever asks to stop, however often it arrives: schedulers and
    `timeout` send it to the whole process group and repeat it, and a
    preempted job must still save. A SIGINT while already stopping raises
    KeyboardInterrupt, so a user who presses Ctrl-C twice can still abort.
    After a SIGTERM, leaving the block keeps ignoring SIGTERM instead of
    restoring the previous handler: the process is on its way out, and a
    late copy of the signal must not kill it after its final save.
    Only the main thread can install handlers; elsewhere this does nothing
    but still offers the event.

    With `watch_output`, a stdout or stderr that loses its reader while the
    block is active (the parent that read the pipe ended, `| head`) is a
    request to stop too: `broken_streams` points it at its fallback file
    (the run's `broken_pipe.log`), and one line on each stream still
    working (else in that file) says so. `requested` polls the pipes, at
    most every `POLL_EVERY` seconds, so a loss is noticed without a write.
    `request(reason)` asks for a stop from code; `reason` says why.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)
    POLL_EVERY = 0.2

    def __init__(self, event=None, watch_output=False):
        self.event = event or threading.Event()
        self.signum = None
        self.reason = None
        self.watch_output = watch_output
        self._previous = {}
        self._unlisten = None
        self._polled = 0.0

    @property
    def requested(self):
        if self._unlisten and time.monotonic() - self._polled > self.POLL_EVERY:
            self._polled = time.monotonic()
            broken_streams.poll()
        return self.event.is_set()

    def request(self, reason):
        """Asks for a stop; the first reason given is kept."""
        if not self.event.is_set():
            self.reason = reason
            self.event.set()

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        if self.watch_output:
            self._unlisten = broken_streams.on_lost(self._lost)
            if broken_streams.lost():  # Before the block: a stop all the same.
                self._lost(broken_streams.lost(), broken_streams.why_lost())
            broken_streams.poll()
        return self

    def __exit__(self, *exc):
        for signum, handler in self._previous.items():
            if signum == signal.SIGTERM and self.signum == signal.SIGTERM:
                handler = signal.SIG_IGN
            signal.signal(signum, handler)
        self._previous.clear()
        if self._unlisten:
            self._unlisten()
            self._unlisten = None

    def _lost(self, names, why):
        text = broken_streams.lost_text(names, why)
        stopping = not self.event.is_set()
        self.request(text[0].upper() + text[1:])
        where = broken_streams.fallback()
        then = ('stopping after the current step and saving' if stopping
                else 'the stop goes on')
        goes = f'goes on in {where}' if where else 'is dropped'
        line = f"This command's {text}: {then}; its output {goes}."
        working = [s for s in ('stdout', 'stderr')
                   if s not in broken_streams.lost()]
        for name in working or ['stdout']:
            print(line, file=getattr(sys, name), flush=True)

    def _handle(self, signum, frame):
        if self.event.is_set():
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            return  # A repeated SIGTERM: the stop is under way already.
        # Set before printing: a second signal (a scheduler signals every
        # process, a parent passes its copy on) can run this handler again
        # inside the print.
        self.signum = signum
        self.event.set()
        print(f'Received {signal.Signals(signum).name}: stopping after the '
              f'current step and saving.', flush=True)


def stop_reason(args, step, start, signal=None):
    """Why the run stops now, or None: a stop signal, `run.steps` reached
    by `step` (train env steps), or `run.duration` seconds passed since
    `start` (a `time.monotonic()` value). The same rule in every runner."""
    if signal is not None and signal.requested:
        return getattr(signal, 'reason', None) or 'Received a stop signal'
    if step >= args.steps:
        return f'Reached run.steps ({int(args.steps)})'
    if args.duration and time.monotonic() - start >= args.duration:
        return f'Reached run.duration ({args.duration} s)'
    return None
