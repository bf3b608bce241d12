"""The checkpoints of a run: agent, replay and logger, saved under one tag.

    logdir/ckpt/agent/<tag>/agent.json, agent.safetensors
    logdir/ckpt/replay/<tag>/replay.json (+ limiter, eval replay)
    logdir/ckpt/logger/<tag>/step.json

The single-process and parallel runners use the same folders, so a run can
switch scripts on one logdir. No folder contains another, and each save of
one moment carries the same tag (the env step), so a resume picks the newest
tag complete and undamaged in every folder even if a crash interrupted the
later writes or a file was cut short afterwards (the damaged file is named).

One path restores for both: `role_checkpoint` makes a role's checkpoint
(keeping `run.save_keep` saves) and `resume` loads it from the resume tag.
The single-process scripts hold all roles in one `RunCheckpoint`; each
parallel role calls `resume_role` for its own.

Saves of earlier versions are pickles (`agent.pkl`, ...), read only with
`run.trust_pickle`; `refuse_pickles` checks at the start, before anything
is written, that a run reads none it was not allowed to.
"""

import elements

from embodied.core import checkpoint as cplib
from embodied.run.parallel import roles as roleslib

ROLES = roleslib.SAVED  # The roles that save, by name.


def directory(logdir, role, replica=None):
    """The checkpoint folder of `role`; with several replicas (`replica`
    given), replay and logger have one folder per replica,
    `ckpt/<role>/<replica:05>`, and the agent's is shared."""
    assert role in ROLES, role
    path = elements.Path(logdir) / 'ckpt' / role
    if replica is not None and role != 'agent':
        path = path / f'{int(replica):05}'
    return path


def replica_of(args):
    """This replica's index when the run has several, else None."""
    if int(args.get('replicas', 1)) > 1:
        return int(args.get('replica', 0))
    return None


class SharedReader(cplib.Checkpoint):
    """The agent's checkpoint on replicas other than 0: the parameters are
    one set, written by replica 0 alone and loaded by every replica, so
    this one loads from the shared folder and never writes, prunes or
    moves saves there."""

    def save(self, tag=None, keys=None):
        return tag

    def set_aside_newer(self, tag):
        return []


def role_checkpoint(args, role, **saveables):
    """The checkpoint of `role` in `args.logdir` holding `saveables`, keeping
    the newest `run.save_keep` saves."""
    replica = replica_of(args)
    folder = directory(args.logdir, role, replica)
    kind = SharedReader if role == 'agent' and replica else cplib.Checkpoint
    cp = kind(folder, args.save_keep, trust_pickle(args))
    for name, saveable in saveables.items():
        setattr(cp, name, saveable)
    return cp


def resume(logdir, checkpoints, replica=None):
    """Loads each checkpoint from the resume tag of `logdir` and returns the
    tag, or None when there is nothing to resume. Saves newer than that tag
    (damaged, or written by some roles only) are set aside first, so the
    saves that follow are not pruned in their favour."""
    tag = resume_tag(logdir, replica=replica)
    if tag is None:
        return None
    for cp in checkpoints:  # Before anything on disk changes.
        cp.refuse_pickles(tag)
    for cp in checkpoints:
        cp.set_aside_newer(tag)
    for cp in checkpoints:
        cp.load(tag)
    return tag


class RunCheckpoint:
    """The checkpoints of every role of a single-process run."""

    def __init__(self, args):
        self.logdir = args.logdir
        self.replica = replica_of(args)
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
        latest = resume(self.logdir, self._used(), self.replica)
        if latest is None:
            self.save(tag)
        return latest


def digest(data):
    """A short sha256 over the parameters of an agent save (`agent.save()`,
    without the random streams' positions `rng/...`, which count each
    replica's own policy calls), by name: replicas of one run print the
    same digest when their parameters are bit-identical."""
    import hashlib
    import numpy as np
    hasher = hashlib.sha256()
    for key in sorted(k for k in data if not k.startswith('rng/')):
        value = np.ascontiguousarray(np.asarray(data[key]))
        hasher.update(key.encode())
        hasher.update(str((value.dtype.str, value.shape)).encode())
        hasher.update(value.tobytes())
    return hasher.hexdigest()[:16]


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


def load_agent(agent, path, regex='', trust=False, key=cplib.TRUST_KEY):
    """Loads agent parameters from `run.from_checkpoint`; a save that does
    not fit the agent raises a ValueError saying so, a pickle save that
    `trust` does not allow raises `checkpoint.PickleSave` naming `key`."""
    folder = agent_save_folder(path)
    elements.print(f'Loading agent from {folder}')
    try:
        cplib.read(
            folder, {'agent': lambda data: agent.load(data, regex or None)},
            trust, key)
    except cplib.PickleSave:
        raise
    except (KeyError, ValueError, TypeError) as e:
        raise ValueError(
            f'run.from_checkpoint {path} does not match the agent: '
            f'{type(e).__name__}: {e}') from e


def trust_pickle(args):
    """Whether the run reads saves written as pickles (`run.trust_pickle`)."""
    return bool(args.get('trust_pickle', False))


def refuse_pickles(args, eval_only=False):
    """Raises `checkpoint.PickleSave` when the run of `args` would read a
    save written as a pickle and `run.trust_pickle` is off; called at the
    start, before anything is written. A run reads the newest save common
    to agent, replay and logger (a resume), else the agent save of
    `run.from_checkpoint`; `eval_only` reads that, or the logdir's newest
    agent save, and its own step (ckpt/eval)."""
    if trust_pickle(args):
        return
    logdir = elements.Path(args.logdir)
    replica = replica_of(args)
    folders = []
    if eval_only:
        source = args.get('from_checkpoint') or logdir
        try:
            folders.append(agent_save_folder(source))
        except FileNotFoundError:
            pass
        tags = cplib.list_tags(logdir / 'ckpt' / 'eval')
        if tags:
            folders.append(logdir / 'ckpt' / 'eval' / f'{tags[-1]:012d}')
    else:
        tag = resume_tag(logdir, report=False, replica=replica, agree=False)
        if tag is not None:
            folders += [directory(logdir, role, replica) / f'{tag:012d}'
                        for role in ROLES]
        elif args.get('from_checkpoint'):
            try:
                folders.append(agent_save_folder(args.from_checkpoint))
            except FileNotFoundError:
                pass  # The run's own check names it.
    for folder in folders:
        found = cplib.pickle_files(folder)
        if found:
            raise cplib.PickleSave(found[0], cplib.TRUST_KEY, resaved=True)


def resume_tag(logdir, report=True, replica=None, agree=True):
    """The newest checkpoint tag complete and undamaged for agent, replay
    and logger; with `report`, damaged saves skipped are printed. With
    several replicas (`replica` given), the newest such tag that every
    replica holds, agreed through the run's replicas where this process
    joined them (`embodied.jax.distributed`) and `agree`."""
    checkpoints = [
        cplib.Checkpoint(directory(logdir, role, replica)) for role in ROLES]
    if replica is None:
        return cplib.latest_common(checkpoints, report)
    tags = []
    while True:
        tag = cplib.latest_common(checkpoints, report and not tags)
        if tag is None:
            break
        tags.append(tag)
        checkpoints = [_Below(cp, tag) for cp in checkpoints]
    if not agree:
        return max(tags) if tags else None
    from embodied.jax import distributed
    return distributed.agree_tags(tags)


class _Below:
    """A checkpoint's view without the tags at or above `limit`."""

    def __init__(self, cp, limit):
        self.cp, self.limit, self.directory = cp, limit, cp.directory

    def tags(self):
        return [t for t in self.cp.tags() if t < self.limit]


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
    return cp, resume(args.logdir, [cp], replica_of(args))
