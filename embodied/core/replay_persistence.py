"""A replay's chunk files in its folder: written in the background when the
replay saves, listed, chosen and read back when it loads.

`Replay.save` decides which chunks to write and `Replay.load` how the read
chunks become items again; this module knows the folder: file names (see
`chunk.py`), the writer threads and their errors, temporary files that an
interrupted write left, and which files a load needs.
"""

import concurrent.futures
import math
import os
import time

import numpy as np

from . import chunk as chunklib
from . import diskfull

STALE_TEMPFILE_SECONDS = 600


class ChunkFiles:
    """The chunk files of the replay named `name` in `directory`."""

    def __init__(self, directory, name):
        self.directory = directory
        self.name = name
        self._writer = None
        self._pending = []

    # Writing --------------------------------------------------------------

    def write(self, chunks):
        """Starts writing `chunks` (complete ones) in the background;
        returns their futures. A failed write marks its chunk unsaved, so
        that the next save writes it again."""
        if self._writer is None:
            self._writer = concurrent.futures.ThreadPoolExecutor(
                2, f'replay_{self.name}_writer')
        self._pending = [f for f in self._pending if not f.done()]
        futures = [self._writer.submit(self._write, c) for c in chunks]
        self._pending += futures
        return futures

    def _write(self, chunk):
        try:
            chunk.write(self.directory)
        except BaseException as e:
            chunk.saved = False  # The next save() tries again.
            if not diskfull.is_full(e):  # The next save() raises those.
                print(f"Replay '{self.name}': could not save "
                      f"{chunk.filename}: {type(e).__name__}: {e}", flush=True)
            raise

    def raise_full_disk(self):
        """Raises the disk-full error of an earlier save's background
        write: a save after it cannot be complete."""
        for future in self._pending:
            if future.done() and diskfull.is_full(future.exception()):
                raise future.exception()

    def wait(self):
        """Waits for the writes started so far (their errors are reported
        already, and their chunks written again by the next save)."""
        for future in list(self._pending):
            try:
                future.result()
            except Exception:
                pass

    def close(self):
        self.wait()
        if self._writer:
            self._writer.shutdown(wait=True)
            self._writer = None

    # Reading --------------------------------------------------------------

    def entries(self, data=None):
        """The chunk files a load considers, as fields of their names
        (`chunk.parse_filename`), and {uuid: items of it already evicted
        at the save}. With `data` from a save: the chunks held at that save
        and those created after it, naming the ones the save had written
        that are gone; without: every file. Removes stale temporary files."""
        directory = str(self.directory)
        names = sorted(os.listdir(directory))
        self._remove_stale_tempfiles(directory, names)
        entries = [e for e in map(chunklib.parse_filename, names) if e]
        skips = {}
        if data and data.get('files'):
            self._report_missing(data['files'], entries)
        if data and data.get('chunks') is not None:
            held = {bytes.fromhex(k): v for k, v in data['chunks'].items()}
            since = data.get('time', math.inf)
            entries = [
                e for e in entries if e['uuid'] in held or e['time'] > since]
            skips = {k: v for k, v in held.items() if v}
        return entries, skips

    def _report_missing(self, files, entries):
        on_disk = {e['uuid'].hex() for e in entries}
        missing = [name for name in files if name not in on_disk]
        if missing:
            shown = ', '.join(missing[:5]) + (' ...' if len(missing) > 5 else '')
            print(f"Replay '{self.name}': {len(missing)} chunk files that the "
                  f"checkpoint holds are missing from {self.directory}, their "
                  f"steps are lost (chunk ids: {shown}).", flush=True)

    def _remove_stale_tempfiles(self, directory, names):
        # A temporary file is left behind when a process dies mid-write. Young
        # ones may belong to a write in progress elsewhere and are left alone.
        now = time.time()
        for name in names:
            if not chunklib.is_tempfile(name):
                continue
            path = os.path.join(directory, name)
            try:
                if now - os.path.getmtime(path) > STALE_TEMPFILE_SECONDS:
                    os.remove(path)
            except FileNotFoundError:
                pass

    def read(self, entries):
        """The chunks of `entries`' files; an unreadable file is reported
        and skipped."""
        def read(entry):
            path = os.path.join(str(self.directory), chunklib.filename(entry))
            try:
                return chunklib.Chunk.read(path)
            except chunklib.ChunkError as e:
                print(f"Replay '{self.name}': skipping chunk file: {e}",
                      flush=True)
                return None
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            return [c for c in pool.map(read, entries) if c is not None]


def choose(entries, skips, amount, length):
    """The newest of `entries` whose items (sequences of `length` steps,
    less `skips`) fill `amount`, going by the file names only."""
    ends = item_ends(entries, length)
    chosen, total = [], 0
    for entry in sorted(entries, key=lambda e: e['time'], reverse=True):
        chosen.append(entry)
        total += max(0, ends[entry['uuid']] - skips.get(entry['uuid'], 0))
        if total >= amount:
            break
    return chosen


def item_ends(entries, length):
    """For each chunk, one past the last index that starts an item of
    `length` steps, given the chains among `entries` (dicts with `uuid`,
    `succ`, `length` and `time`).

    A chunk is always newer than the chunk it continues, so going from new
    to old sees every successor before its predecessor.
    """
    ahead, ends = {}, {}
    for e in sorted(entries, key=lambda e: e['time'], reverse=True):
        following = ahead.get(e['succ'], 0)
        ahead[e['uuid']] = e['length'] + following
        ends[e['uuid']] = int(np.clip(
            e['length'] - length + 1 + following, 0, e['length']))
    return ends
