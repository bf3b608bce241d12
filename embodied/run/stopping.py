"""When a run stops: SIGTERM / SIGINT become a request to stop at the next
safe point (`StopSignal`), and one rule, `stop_reason`, that the
single-process scripts (`loop.Loop`) and the parallel launcher share."""

import signal
import threading
import time


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
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, event=None):
        self.event = event or threading.Event()
        self.signum = None
        self._previous = {}

    @property
    def requested(self):
        return self.event.is_set()

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc):
        for signum, handler in self._previous.items():
            if signum == signal.SIGTERM and self.signum == signal.SIGTERM:
                handler = signal.SIG_IGN
            signal.signal(signum, handler)
        self._previous.clear()

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
        return 'Received a stop signal'
    if step >= args.steps:
        return f'Reached run.steps ({int(args.steps)})'
    if args.duration and time.monotonic() - start >= args.duration:
        return f'Reached run.duration ({args.duration} s)'
    return None
