"""Files in shared memory whose names carry the pid of the process that
made them, so that the next process to make one on the machine deletes
those whose maker died before it unlinked them."""

import os
import tempfile

SHM_DIR = '/dev/shm'


def create(prefix, directory, setup):
    """Makes a file `<prefix><pid>-*` in `directory` and returns `(path,
    setup(fd))`. Deletes first the files of `prefix` whose process died,
    and the new file when `setup` raises; closes `fd` either way."""
    remove_stale(directory, prefix)
    fd, path = tempfile.mkstemp(
        prefix=f'{prefix}{os.getpid()}-', dir=directory)
    try:
        return path, setup(fd)
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)


def unlink(path):
    """Removes `path`'s name, if it is still there."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def remove_stale(directory, prefix):
    """Deletes the files of `prefix` in `directory` whose process died."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        pid = name[len(prefix):].split('-', 1)[0]
        if name.startswith(prefix) and pid.isdigit() and not _alive(int(pid)):
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # Another user's process.
    return True
