"""A sweep's runs on this machine, `parallel` at a time.

Each run is `python -m embodied.main` with the run's flags, a child process
(`children`) whose output is appended to `output.log` in its folder. The
first Ctrl-C (SIGINT) or SIGTERM to the sweep stops every running run with
its final save (SIGTERM to the run's process group) and starts no more; a
second Ctrl-C kills them (their newest complete saves stay). Rerunning the
sweep resumes the runs that did not reach their `run.steps`.
"""

import os
import signal
import sys
import time

from embodied.sweep import children
from embodied.sweep import state

EXIT_FAILED = 1
EXIT_SIGNAL = {signal.SIGINT: 130, signal.SIGTERM: 143}
OUTPUT = 'output.log'


def run(runs, parallel=1, python=None, env=None, say=print, poll=0.2):
    """Runs the unfinished of `runs` (`grid.Run`s), `parallel` at a time,
    and skips the finished ones, saying which. Returns the exit code: 0
    when every run finished, 1 when a run failed or ended before its
    run.steps, 130 or 143 when a SIGINT or SIGTERM stopped the sweep."""
    python = python or sys.executable
    parallel = max(1, int(parallel))
    pending = []
    for run in runs:
        done, where = state.describe(run)
        if done:
            say(f'Skipping {run.name}: {where}.')
        else:
            pending.append(run)
    if not pending:
        say('Every run of the sweep is finished.')
        return 0
    say(f'Running {len(pending)} of {len(runs)} runs, {parallel} at a '
        f'time; each run\'s output is in its folder\'s {OUTPUT}.')
    stopping = _Stopping(say)
    running = {}  # Popen -> Run
    failed = []
    try:
        with stopping:
            while pending or running:
                while pending and len(running) < parallel and (
                        not stopping.signum):
                    run = pending.pop(0)
                    running[_start(run, python, env, say)] = run
                if stopping.signum and not stopping.sent:
                    stopping.stop(running)
                time.sleep(poll)
                for proc in [p for p in running if p.poll() is not None]:
                    run = running.pop(proc)
                    if not _ended(run, proc.returncode, stopping, say):
                        failed.append(run)
    finally:
        if running:  # Left by an error of the sweep itself.
            children.stop(list(running))
    if stopping.signum:
        left = sum(not state.finished(run) for run in runs)
        say(f'Sweep stopped by {signal.Signals(stopping.signum).name}; '
            f'{left} runs unfinished. The same command resumes them.')
        return EXIT_SIGNAL.get(stopping.signum, EXIT_FAILED)
    if failed:
        say(f'{len(failed)} of {len(runs)} runs did not finish: '
            f'{", ".join(run.name for run in failed)}.')
        return EXIT_FAILED
    say('Every run of the sweep is finished.')
    return 0


def _start(run, python, env, say):
    _, where = state.describe(run)
    run.logdir.mkdir(parents=True, exist_ok=True)
    verb = 'Resuming' if where.startswith('saved') else 'Starting'
    say(f'{verb} {run.name} ({where}).')
    environ = dict(os.environ if env is None else env)
    environ.setdefault('PYTHONUNBUFFERED', '1')
    return children.start(
        [python, '-m', 'embodied.main', *run.argv], run.logdir / OUTPUT,
        env=environ)


def _ended(run, code, stopping, say):
    """Says how the run ended; True when it finished or was stopped by
    the sweep with its save."""
    done, where = state.describe(run)
    if code == 0 and done:
        say(f'Finished {run.name} ({where}).')
        return True
    if code == 0 and stopping.sent:
        say(f'Stopped {run.name} ({where}).')
        return True
    if code == -signal.SIGTERM and stopping.sent:
        say(f'Stopped {run.name} before its loop began, without a final '
            f'save ({where}).')
        return True
    log = run.logdir / OUTPUT
    if code == 0:
        say(f'{run.name} ended before its run.steps ({where}); see {log}.')
    else:
        say(f'{run.name} failed with exit code {code} ({where}); its last '
            f'lines ({log}):')
        for line in _tail(log):
            say(f'  {line}')
    return False


def _tail(path, lines=10):
    try:
        with open(path, 'rb') as f:
            f.seek(max(0, os.path.getsize(path) - 8192))
            text = f.read().decode(errors='replace')
    except OSError:
        return []
    return text.splitlines()[-lines:]


class _Stopping:
    """SIGINT and SIGTERM handlers while the sweep runs: the first signal
    asks for a stop (the main loop then stops the runs), a second SIGINT
    kills the runs' process groups."""

    def __init__(self, say):
        self.say = say
        self.signum = None
        self.sent = False
        self.running = {}
        self._previous = {}

    def __enter__(self):
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum, frame):
        if self.signum is None:
            self.signum = signum
            return
        if signum == signal.SIGINT and self.sent:
            self.say('Second Ctrl-C: killing the runs (their newest '
                     'complete saves stay).')
            for proc in self.running:
                children.signal_group(proc, signal.SIGKILL)

    def stop(self, running):
        self.say(f'Received {signal.Signals(self.signum).name}: stopping '
                 f'{len(running)} runs with their final saves (a second '
                 f'Ctrl-C kills them).')
        self.running = running
        for proc in running:
            children.signal_group(proc, signal.SIGTERM)
        self.sent = True
