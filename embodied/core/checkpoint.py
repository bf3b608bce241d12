"""Crash-safe checkpoints: a save is either complete on disk or absent.

Layout of a checkpoint directory::

    directory/
      000000001200/     one complete save, named by its integer tag
        agent.json        the structure of what agent.save() returned
        agent.safetensors its arrays (absent when it holds none)
        replay-0000.json  (a saveable whose save() yields shards)
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

Nothing in a save runs code when it is read: each entry is its structure
in JSON and its arrays in a safetensors file (`savetree`, `tensorfile`). A
`save()` that returns what neither holds (an object of a class, a set) is
refused at that save, naming the entry (`savetree.Unsavable`). Saves of
earlier versions, and the original DreamerV3's, are pickles (`agent.pkl`):
they are read only where the caller trusts them (`trust_pickle`), else
refused with `PickleSave`; the next save of a trusted one is in the new
format.

A save damaged after it was written (a truncated or deleted file: disk full,
a copy cut short, a hand edit) is told apart without reading it whole: the
manifest in `done` lists each file's size, a safetensors header gives the
file's length, and every pickle ends with its STOP opcode (which also
covers pickle saves written before the manifest). `damage` says what is
wrong with a save, `latest_common` skips damaged saves naming the file, and
`read` names the file that cannot be read.
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
from . import savetree
from . import tensorfile

_NAME = re.compile(r'^\d{12}$')
_UNUSED = re.compile(r'^unused-(\d{12})-')
_PICKLE_STOP = b'.'  # The last byte of every pickle.
_SUFFIXES = ('.json', '.safetensors', '.pkl')
FORMAT = 'embodied.save'
VERSION = 1
TRUST_KEY = '--run.trust_pickle True'  # How a run trusts pickle saves.


class DamagedCheckpoint(RuntimeError):
    """A save on disk cannot be read; the message names the file."""


class PickleSave(ValueError):
    """A save written as a pickle, which the caller did not trust: reading
    it could run any code it holds. `filename` is its file; `key` the
    setting that trusts it; `resaved`: the reader saves again (in the new
    format) after reading it."""

    def __init__(self, filename, key=TRUST_KEY, resaved=False):
        self.filename = str(filename)
        self.key = key
        then = '; the next save is then in the new format' if resaved else ''
        super().__init__(
            f'{filename} is a pickle save (written by an earlier version '
            f'of embodied, or a DreamerV3 checkpoint), and reading a pickle '
            f'can run any code it holds: it is read only with {key}, for a '
            f'save you trust{then}.')


class Checkpoint:

    def __init__(self, directory, keep=2, trust_pickle=False,
                 trust_key=TRUST_KEY):
        """`trust_pickle`: read saves written as pickles (else `load`
        raises PickleSave naming `trust_key`, the setting that allows it)."""
        assert keep is None or keep >= 1, keep
        self._directory = elements.Path(directory)
        self._keep = keep
        self._trust = (bool(trust_pickle), trust_key)
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

    @property
    def trust_pickle(self):
        return self._trust[0]

    def pickles(self, tag):
        """The pickle files that loading the save `tag` would read, when
        this checkpoint does not trust them; else []."""
        if self.trust_pickle:
            return []
        return pickle_files(
            self._directory / f'{tag:012d}', list(self._saveables))

    def refuse_pickles(self, tag):
        """Raises PickleSave when loading `tag` would read an untrusted
        pickle."""
        found = self.pickles(tag)
        if found:
            raise PickleSave(found[0], self._trust[1], resaved=True)

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
            read(path, {k: self._saveables[k].load for k in keys},
                 *self._trust, resaved=True)
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


def load(path, loadfns, trust_pickle=False, trust_key=TRUST_KEY):
    """Loads named entries of a save (or of the latest save in a directory)
    into the given functions, e.g. `load(p, {'agent': agent.load})`."""
    read(resolve(path), loadfns, trust_pickle, trust_key)


def write(path, savefns):
    path = elements.Path(path)
    parent = str(path.parent)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f'.tmp-{path.name}-{uuid.uuid4().hex[:8]}')
    os.makedirs(tmp)
    try:
        sizes = {}

        def put(filename, content):
            sizes[filename] = _write_file(
                os.path.join(tmp, filename), content,
                shown=os.path.join(str(path), filename))

        for name, savefn in savefns.items():
            data = savefn()
            if inspect.isgenerator(data):
                for i, shard in enumerate(data):
                    _put_entry(put, f'{name}-{i:04d}', shard)
            else:
                _put_entry(put, name, data)
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


def _put_entry(put, stem, data):
    """Writes one entry as `stem.json` (+ `stem.safetensors`)."""
    tree, arrays = savetree.split(data, stem)
    arrays_file = f'{stem}.safetensors' if arrays else None
    if arrays:
        put(arrays_file, lambda f: tensorfile.write(f, arrays))
    put(f'{stem}.json', json.dumps({
        'format': FORMAT, 'version': VERSION, 'arrays': arrays_file,
        'tree': tree}).encode())


def read(path, loadfns, trust_pickle=False, trust_key=TRUST_KEY,
         resaved=False, report=True):
    """Loads the entries of the save folder `path` into `loadfns` ({name:
    fn}). A pickle entry raises PickleSave unless `trust_pickle`; when
    trusted, with `report`, one line says it was read as a pickle (with
    `resaved`: and that its next save is in the new format)."""
    path = str(path)
    names = set(os.listdir(path))
    told = []
    for name, loadfn in loadfns.items():
        stems = _stems(name, names)
        if not stems:
            raise KeyError(
                f"Checkpoint {path} has no entry '{name}' "
                f"(it has: {sorted(names - {'done'})}).")
        if stems[0][1] == '.pkl':
            if not trust_pickle:
                raise PickleSave(
                    os.path.join(path, stems[0][0] + '.pkl'), trust_key,
                    resaved)
            if report and not told:
                told.append(path)
                then = ('; the next save is in the new format'
                        if resaved else '')
                elements.print(
                    f'Read {path} as a pickle save ({trust_key}){then}.',
                    color='yellow')
        if len(stems) == 1 and stems[0][0] == name:
            loadfn(_read_stem(path, *stems[0]))
        else:
            def generator(stems=stems):
                for stem, suffix in stems:
                    yield _read_stem(path, stem, suffix)
            loadfn(generator())


def read_entry(path, name, trust_pickle=False, trust_key=TRUST_KEY,
               report=True):
    """The data of entry `name` of the save folder `path` (its shards as
    a list); raises KeyError when it has none, PickleSave as `read`."""
    result = []

    def keep(data):
        result.append(list(data) if inspect.isgenerator(data) else data)
    read(path, {name: keep}, trust_pickle, trust_key, report=report)
    return result[0]


def _stems(name, names):
    """[(stem, suffix)] of entry `name` among the file `names`: the entry
    itself, or its shards in order; the new format where both exist."""
    for suffix in ('.json', '.pkl'):
        if f'{name}{suffix}' in names:
            return [(name, suffix)]
        shard = re.compile(rf'^{re.escape(name)}-\d{{4}}{re.escape(suffix)}$')
        shards = sorted(x for x in names if shard.match(x))
        if shards:
            return [(x[:-len(suffix)], suffix) for x in shards]
    return []


def pickle_files(path, entries=None):
    """The pickle files among the `entries` (names; None: all) of the save
    folder `path` (an entry of the new format wins where both exist)."""
    try:
        names = set(os.listdir(str(path)))
    except FileNotFoundError:
        return []
    if entries is None:
        entries = {re.sub(r'-\d{4}$', '', n.rsplit('.', 1)[0])
                   for n in names if n.endswith(_SUFFIXES)}
    found = []
    for name in entries:
        found += [os.path.join(str(path), stem + suffix)
                  for stem, suffix in _stems(name, names) if suffix == '.pkl']
    return found


def _read_stem(path, stem, suffix):
    if suffix == '.pkl':
        return _unpickle(os.path.join(path, stem + '.pkl'))
    filename = os.path.join(path, stem + '.json')
    try:
        with open(filename, 'rb') as f:
            meta = json.loads(f.read())
        if not isinstance(meta, dict) or meta.get('format') != FORMAT:
            raise ValueError(f'not a save of embodied (format {FORMAT})')
        if int(meta.get('version', 0)) > VERSION:
            raise ValueError(
                f"written by a newer version of embodied (save format "
                f"{meta['version']}, this one reads {VERSION})")
        arrays = {}
        if meta.get('arrays'):
            filename = os.path.join(path, os.path.basename(meta['arrays']))
            arrays, _ = tensorfile.read(filename)
            filename = os.path.join(path, stem + '.json')
        return savetree.join(meta['tree'], arrays)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DamagedCheckpoint(
            f'Cannot read checkpoint file {filename}: {type(e).__name__}: '
            f'{e}') from e


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
    it should hold is there with its full size, each safetensors file as
    long as its header says, each JSON file whole and each pickle ending
    like one."""
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
    expected = sizes or {n: None for n in names if n.endswith(_SUFFIXES)}
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
        if name.endswith('.pkl') and last != _PICKLE_STOP:
            return f'{filename} is cut short (it does not end a pickle)'
        if name.endswith('.safetensors'):
            problem = tensorfile.problem(filename)
            if problem:
                return problem
        if name.endswith('.json') and not _is_json(filename):
            return f'{filename} is cut short (it is not whole JSON)'
    return None


def _is_json(filename):
    try:
        with open(filename, 'rb') as f:
            json.loads(f.read())
        return True
    except ValueError:  # UnicodeDecodeError too.
        return False


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
    """Writes and fsyncs a file; returns its size. `content` is bytes, or
    a function that writes to the open file. A disk-full error names
    `shown` (the path the file is written for) or `filename`."""
    with diskfull.writing(shown or filename), open(filename, 'wb') as f:
        if callable(content):
            content(f)
        else:
            f.write(content)
        f.flush()
        os.fsync(f.fileno())
        return f.tell()


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
