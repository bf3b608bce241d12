"""The checkpoints of a run: agent, replay and logger, saved under one tag.

    logdir/ckpt/agent/<tag>/agent.pkl
    logdir/ckpt/replay/<tag>/replay.pkl (+ limiter, eval replay)
    logdir/ckpt/logger/<tag>/step.pkl

The single-process and parallel runners use the same folders, so a run can
switch scripts on one logdir. No folder contains another, and each save of
one moment carries the same tag (the env step), so a resume picks the newest
tag complete and undamaged in every folder even if a crash interrupted the
later writes or a file was cut short afterwards (the damaged file is named).

One path restores for both: `role_checkpoint` makes a role's checkpoint
(keeping `run.save_keep` saves) and `resume` loads it from the resume tag.
The single-process scripts hold all roles in one `RunCheckpoint`; each
parallel role calls `resume_role` for its own.
"""

import elements

from embodied.core import checkpoint as cplib

ROLES = ('agent', 'replay', 'logger')


def directory(logdir, role):
    assert role in ROLES, role
    return elements.Path(logdir) / 'ckpt' / role


def role_checkpoint(args, role, **saveables):
    """The checkpoint of `role` in `args.logdir` holding `saveables`, keeping
    the newest `run.save_keep` saves."""
    cp = cplib.Checkpoint(directory(args.logdir, role), args.save_keep)
    for name, saveable in saveables.items():
        setattr(cp, name, saveable)
    return cp


def resume(logdir, checkpoints):
    """Loads each checkpoint from the resume tag of `logdir` and returns the
    tag, or None when there is nothing to resume. Saves newer than that tag
    (damaged, or written by some roles only) are set aside first, so the
    saves that follow are not pruned in their favour."""
    tag = resume_tag(logdir)
    if tag is None:
        return None
    for cp in checkpoints:
        cp.set_aside_newer(tag)
    for cp in checkpoints:
        cp.load(tag)
    return tag


class RunCheckpoint:
    """The checkpoints of every role of a single-process run."""

    def __init__(self, args):
        self.logdir = args.logdir
        self.roles = {role: role_checkpoint(args, role) for role in ROLES}

    def __getitem__(self, role):
        return self.roles[role]

    def _used(self):
        return [cp for cp in self.roles.values() if cp._saveables]

    def save(self, tag):
        for cp in self._used():
            cp.save(tag)

    def load(self, tag):
        for cp in self._used():
            cp.load(tag)

    def load_or_save(self, tag=0):
        """Loads the newest common save and returns its tag, or saves `tag`
        and returns None when there is nothing to resume."""
        latest = resume(self.logdir, self._used())
        if latest is None:
            self.save(tag)
        return latest


def agent_save_folder(path):
    """The agent save that `run.from_checkpoint` names: a logdir, its
    ckpt/agent folder, or one save folder. Raises FileNotFoundError."""
    path = elements.Path(path)
    if (path / 'ckpt' / 'agent').exists():
        path = path / 'ckpt' / 'agent'
    try:
        return cplib.resolve(path)
    except FileNotFoundError as e:
        raise FileNotFoundError(f'run.from_checkpoint: {e}') from None


def load_agent(agent, path, regex=''):
    """Loads agent parameters from `run.from_checkpoint`; a save that does
    not fit the agent raises a ValueError saying so."""
    folder = agent_save_folder(path)
    elements.print(f'Loading agent from {folder}')
    try:
        cplib.read(
            folder, {'agent': lambda data: agent.load(data, regex or None)})
    except (KeyError, ValueError, TypeError) as e:
        raise ValueError(
            f'run.from_checkpoint {path} does not match the agent: '
            f'{type(e).__name__}: {e}') from e


def resume_tag(logdir, report=True):
    """The newest checkpoint tag complete and undamaged for agent, replay
    and logger; with `report`, damaged saves skipped are printed."""
    return cplib.latest_common([
        cplib.Checkpoint(directory(logdir, role)) for role in ROLES], report)


def rewind_outputs(logger, tag):
    """After the logger's step was restored to `tag` (None: a fresh start
    at 0), has each output that keeps earlier launches' metrics drop or
    move aside what was written for steps after it, so a resumed run's
    metrics never repeat steps (see `JSONLOutput.rewind`)."""
    step = int(tag or 0) * getattr(logger, 'multiplier', 1)
    for output in getattr(logger, 'outputs', ()):
        rewind = getattr(output, 'rewind', None)
        if rewind:
            moved = rewind(step)
            if moved:
                print(f'Moved {moved} metrics lines of steps after the '
                      f'resumed step {step} aside (see *.rewound.jsonl).',
                      flush=True)


def resume_role(args, role, **saveables):
    """`(checkpoint, tag)` of one role of the parallel runner: its
    checkpoint holding `saveables`, loaded from the resume tag when there
    is one (`tag` is None otherwise)."""
    cp = role_checkpoint(args, role, **saveables)
    return cp, resume(args.logdir, [cp])
