"""The checkpoints of a run: agent, replay and logger, saved under one tag.

    logdir/ckpt/agent/<tag>/agent.pkl
    logdir/ckpt/replay/<tag>/replay.pkl (+ limiter, eval replay)
    logdir/ckpt/logger/<tag>/step.pkl

The single-process and parallel runners use the same folders, so a run can
switch scripts on one logdir. No folder contains another, and each save of
one moment carries the same tag (the env step), so a resume picks the newest
tag complete in every folder even if a crash interrupted the later writes.
"""

import elements

from embodied.core import checkpoint as cplib

ROLES = ('agent', 'replay', 'logger')


def directory(logdir, role):
    assert role in ROLES, role
    return elements.Path(logdir) / 'ckpt' / role


class RunCheckpoint:

    def __init__(self, logdir, keep=2):
        self.roles = {
            role: cplib.Checkpoint(directory(logdir, role), keep)
            for role in ROLES}

    def __getitem__(self, role):
        return self.roles[role]

    def _used(self):
        return [cp for cp in self.roles.values() if cp._saveables]

    def latest(self):
        return cplib.latest_common(self._used())

    def save(self, tag):
        for cp in self._used():
            cp.save(tag)

    def load(self, tag):
        for cp in self._used():
            cp.load(tag)

    def load_or_save(self, tag=0):
        """Loads the newest common save and returns its tag, or saves `tag`
        and returns None when there is nothing to resume."""
        latest = self.latest()
        if latest is None:
            self.save(tag)
            return None
        self.load(latest)
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


def resume_tag(logdir):
    """The newest checkpoint tag complete for agent, replay and logger."""
    return cplib.latest_common([
        cplib.Checkpoint(directory(logdir, role)) for role in ROLES])


def resume_role(args, role, **saveables):
    """`(checkpoint, tag)` of one role of the parallel runner: its
    checkpoint holding `saveables`, loaded from the resume tag when there
    is one (`tag` is None otherwise)."""
    cp = cplib.Checkpoint(directory(args.logdir, role), args.save_keep)
    for name, saveable in saveables.items():
        setattr(cp, name, saveable)
    tag = resume_tag(args.logdir)
    if tag is not None:
        cp.load(tag)
    return cp, tag
