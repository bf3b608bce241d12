"""Crash-safe checkpoints: a save is either complete on disk or absent.

Layout of a checkpoint directory::

    directory/
      000000001200/     one complete save, named by its integer tag
        agent.pkl
        replay-0000.pkl   (a saveable whose save() yields shards)
        done              the manifest: {file name: size in bytes}
      000000002400/
      .tmp-...          a save in progress; ignored and removed later
      damaged-...       a save found damaged on resume, kept for inspection
      unused-...        a save newer than the one resumed from (a crash hit
                        the save of some roles only); never loaded, and
                        removed once it is older than every kept save

Each save is written into a temporary folder, every file is fsynced, and the
folder is renamed into place, so a process killed mid-save leaves the previous
saves intact. Only folders this class created are ever deleted: unrelated files
in the directory are left alone. Tags are integers chosen by the caller (the
parallel runner uses one tag for the agent, replay and logger saves of the same
moment); without a tag, a save takes the next number after the latest.

A save damaged after it was written (a truncated or deleted file: disk full,
a copy cut short, a hand edit) is told apart without unpickling it: the
manifest in `done` lists each file's size, and every pickle ends with its
STOP opcode (which also covers saves written before the manifest). `damage`
says what is wrong with a save, `latest_common` skips damaged saves naming
the file, and `read` names the file whose unpickling failed.
"""

import inspect
import json
import os
import pickle
import re
import shutil
import uuid

import elements

from . import diskfull

_NAME = re.compile(r'^\d{12}$')
_UNUSED = re.compile(r'^unused-(\d{12})-')
_PICKLE_STOP = b'.'  # The last byte of every pickle.


class DamagedCheckpoint(RuntimeError):
    """A save on disk cannot be read; the message names the file."""


class Checkpoint:

    def __init__(self, directory, keep=2):
        assert keep is None or keep >= 1, keep
        self._directory = elements.Path(directory)
        self._keep = keep
        self._saveables = {}

    def __setattr__(self, name, value):
        if name.startswith('_'):
            return super().__setattr__(name, value)
        if not (callable(getattr(value, 'save', None)) and
                callable(getattr(value, 'load', None))):
            raise ValueError(
                f"Checkpointed object '{name}' must implement save() and "
                f"load(), got {type(value).__name__}.")
        self._saveables[name] = value

    def __getattr__(self, name):
        if name.startswith('_'):
            raise AttributeError(name)
        try:
            return self._saveables[name]
        except KeyError:
            raise AttributeError(name)

    @property
    def directory(self):
        return self._directory

    def tags(self):
        """Tags of the complete saves, oldest first."""
        return list_tags(self._directory)

    def latest(self):
        tags = self.tags()
        return tags[-1] if tags else None

    def exists(self):
        return self.latest() is not None

    def save(self, tag=None, keys=None):
        """Writes every attached object; returns the tag of the save."""
        if tag is None:
            latest = self.latest()
            tag = 0 if latest is None else latest + 1
        tag = int(tag)
        keys = list(self._saveables) if keys is None else keys
        savefns = {k: self._saveables[k].save for k in keys}
        path = self._directory / f'{tag:012d}'
        elements.print(f'Saving checkpoint: {path}')
        write(path, savefns)
        self._cleanup()
        return tag

    def load(self, tag=None, keys=None):
        """Restores the attached objects from the save `tag` (or the latest)."""
        tag = self.latest() if tag is None else int(tag)
        if tag is None:
            raise FileNotFoundError(
                f'No complete checkpoint in {self._directory}.')
        keys = list(self._saveables) if keys is None else keys
        path = self._directory / f'{tag:012d}'
        elements.print(f'Loading checkpoint: {path}')
        try:
            read(path, {k: self._saveables[k].load for k in keys})
        except DamagedCheckpoint as e:
            # Out of the way, so that the next start resumes from the save
            # before it, which every role still holds.
            name = f'damaged-{path.name}-{uuid.uuid4().hex[:8]}'
            target = self._directory / name
            os.rename(str(path), str(target))
            raise DamagedCheckpoint(
                f'{e} The save was moved to {target}; start the run again '
                f'to resume from the save before it.') from e
        return tag

    def set_aside_newer(self, tag):
        """Renames the saves newer than `tag` (the one a run resumes from)
        to `damaged-<tag>` or `unused-<tag>`, so that later saves of lower
        tags are not dropped in favour of them; returns the new names."""
        moved = []
        for newer in [t for t in self.tags() if t > tag]:
            name = f'{newer:012d}'
            kind = 'damaged' if damage(self._directory / name) else 'unused'
            target = f'{kind}-{name}-{uuid.uuid4().hex[:8]}'
            try:
                os.rename(os.path.join(str(self._directory), name),
                          os.path.join(str(self._directory), target))
            except FileNotFoundError:
                continue
            moved.append(target)
        if moved:
            elements.print(
                f'Set aside saves newer than the resumed one {tag} in '
                f'{self._directory}: {", ".join(moved)}')
        return moved

    def load_or_save(self):
        """Loads the latest save if there is one, else writes a first save."""
        if self.exists():
            return self.load()
        return self.save()

    def _cleanup(self):
        """Removes interrupted writes, the complete saves beyond the newest
        `keep`, and saves set aside as unused once every kept save is newer
        (else each crash between the roles' saves would leave one behind
        for good). Damaged saves stay for inspection."""
        folder = str(self._directory)
        tags = self.tags()
        kept = tags[-self._keep:] if self._keep else tags
        for tag in tags[:len(tags) - len(kept)]:
            shutil.rmtree(os.path.join(folder, f'{tag:012d}'), True)
        for name in os.listdir(folder):
            unused = _UNUSED.match(name)
            if name.startswith('.tmp-') or (
                    unused and self._keep and kept
                    and int(unused.group(1)) < kept[0]):
                shutil.rmtree(os.path.join(folder, name), True)


def list_tags(directory):
    directory = str(directory)
    if not os.path.isdir(directory):
        return []
    tags = []
    for name in os.listdir(directory):
        if _NAME.match(name) and os.path.exists(
                os.path.join(directory, name, 'done')):
            tags.append(int(name))
    return sorted(tags)


def resolve(path):
    """A save folder from a path to a save or to a checkpoint directory."""
    path = elements.Path(path)
    if (path / 'done').exists():
        return path
    tags = list_tags(path)
    if not tags:
        raise FileNotFoundError(
            f'No complete checkpoint at {path}: expected a save folder with '
            f'a done marker or a directory of saves.')
    return path / f'{tags[-1]:012d}'


def load(path, loadfns):
    """Loads named entries of a save (or of the latest save in a directory)
    into the given functions, e.g. `load(p, {'agent': agent.load})`."""
    read(resolve(path), loadfns)


def write(path, savefns):
    path = elements.Path(path)
    parent = str(path.parent)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f'.tmp-{path.name}-{uuid.uuid4().hex[:8]}')
    os.makedirs(tmp)
    try:
        sizes = {}

        def put(filename, content):
            _write_file(os.path.join(tmp, filename), content,
                        shown=os.path.join(str(path), filename))
            sizes[filename] = len(content)

        for name, savefn in savefns.items():
            data = savefn()
            if inspect.isgenerator(data):
                for i, shard in enumerate(data):
                    put(f'{name}-{i:04d}.pkl', pickle.dumps(shard))
            else:
                put(f'{name}.pkl', pickle.dumps(data))
        _write_file(os.path.join(tmp, 'done'), json.dumps(
            {'files': sizes}, sort_keys=True).encode())
        _fsync_dir(tmp)
        final = str(path)
        if os.path.exists(final):
            # Replacing a save with the same tag: move the old one aside first
            # so that a crash in between still leaves one complete save.
            old = os.path.join(parent, f'.tmp-old-{uuid.uuid4().hex[:8]}')
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
        _fsync_dir(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def read(path, loadfns):
    path = str(path)
    names = set(os.listdir(path))
    for name, loadfn in loadfns.items():
        if f'{name}.pkl' in names:
            loadfn(_unpickle(os.path.join(path, f'{name}.pkl')))
        elif f'{name}-0000.pkl' in names:
            shards = sorted(
                x for x in names
                if re.match(rf'^{re.escape(name)}-\d{{4}}\.pkl$', x))

            def generator(shards=shards):
                for shard in shards:
                    yield _unpickle(os.path.join(path, shard))
            loadfn(generator())
        else:
            raise KeyError(
                f"Checkpoint {path} has no entry '{name}' "
                f"(it has: {sorted(names - {'done'})}).")


def _unpickle(filename):
    try:
        with open(filename, 'rb') as f:
            return pickle.load(f)
    except (pickle.UnpicklingError, EOFError, ValueError, AttributeError,
            ImportError, IndexError, TypeError) as e:
        raise DamagedCheckpoint(
            f'Cannot read checkpoint file {filename}: {type(e).__name__}: '
            f'{e}') from e


def damage(path):
    """What makes the save folder `path` unreadable, or None when every file
    it should hold is there with its full size and ends like a pickle."""
    path = str(path)
    try:
        with open(os.path.join(path, 'done'), 'rb') as f:
            marker = f.read()
        names = os.listdir(path)
    except FileNotFoundError:
        return f'{path} is gone'
    try:
        sizes = json.loads(marker)['files'] if marker else None
    except (ValueError, KeyError, TypeError):
        return f'{os.path.join(path, "done")} is not a manifest of the save'
    expected = sizes or {n: None for n in names if n.endswith('.pkl')}
    for name, size in sorted(expected.items()):
        filename = os.path.join(path, name)
        try:
            actual = os.path.getsize(filename)
            with open(filename, 'rb') as f:
                f.seek(max(0, actual - 1))
                last = f.read(1)
        except FileNotFoundError:
            return f'{filename} is missing'
        if size is not None and actual != size:
            return f'{filename} has {actual} bytes, the save wrote {size}'
        if last != _PICKLE_STOP:
            return f'{filename} is cut short (it does not end a pickle)'
    return None


def write_atomic(filename, content):
    """Writes bytes to a file so that readers see the old or the new file."""
    filename = str(filename)
    tmp = f'{filename}.tmp-{uuid.uuid4().hex[:8]}'
    try:
        _write_file(tmp, content, shown=filename)
        os.replace(tmp, filename)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    _fsync_dir(os.path.dirname(filename) or '.')


def _write_file(filename, content, shown=None):
    """Writes and fsyncs a file; a disk-full error names `shown` (the
    path the file is written for) or `filename`."""
    with diskfull.writing(shown or filename), open(filename, 'wb') as f:
        f.write(content)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(directory):
    fd = os.open(directory, os.O_RDONLY)
    try:
        with diskfull.writing(directory):
            os.fsync(fd)
    finally:
        os.close(fd)


def latest_common(checkpoints, report=True):
    """The newest tag that every given checkpoint has completely and
    undamaged, or None. With `report`, prints each damaged save skipped.

    Roles that save together (agent, replay, logger) write the same tag, so a
    crash between their writes leaves the previous common tag to resume from;
    a damaged file in one role's save makes the whole tag unusable, and the
    next older common tag is used (every role decides the same on the same
    disk, so they still resume together).
    """
    common = None
    for cp in checkpoints:
        tags = set(cp.tags())
        common = tags if common is None else common & tags
    for tag in sorted(common or (), reverse=True):
        problems = [damage(cp.directory / f'{tag:012d}') for cp in checkpoints]
        problems = [p for p in problems if p]
        if not problems:
            return tag
        if report:
            elements.print(
                f'Skipping the damaged save at step {tag}: '
                f'{"; ".join(problems)}.', color='red')
    return None
