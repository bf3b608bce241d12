"""Whether a sweep's run is finished, read from the run's own saves: a run
is finished when its newest complete save (the tag every role holds, the
env step it was taken at) is at its `run.steps` or beyond. A run stopped
early (Ctrl-C, SIGTERM, `run.duration`, a crash) is not, and a rerun of the
sweep resumes it; raising `run.steps` makes a finished run unfinished."""

from embodied.run import saving


def saved_step(logdir):
    """The env step of the run's newest complete save, or None."""
    if not (logdir / 'ckpt').is_dir():
        return None
    return saving.resume_tag(logdir, report=False)


def describe(run):
    """(finished, a few words on the run's state) for a `grid.Run`."""
    step = saved_step(run.logdir)
    if step is None:
        started = run.logdir.exists()
        return False, 'no save yet' if started else 'new'
    if step >= run.steps:
        return True, f'finished at step {step} of {run.steps}'
    return False, f'saved at step {step} of {run.steps}'


def finished(run):
    """Whether the run reached its `run.steps`."""
    return describe(run)[0]
