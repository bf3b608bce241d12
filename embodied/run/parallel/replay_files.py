"""Deletes the replay's chunk files that no kept checkpoint needs.

Chunk files are written once and never rewritten, so without this a long run
fills the disk. `Replay.load(data)` reads the chunks a save held (`chunks`)
plus every chunk created after it (`time`), so a file is still needed while
any kept save holds it or is older than it. The parallel replay prunes after
each save:

    cp.save(tag)
    replay_files.prune(replay.directory, cp.directory, 'replay')

Only saves still on disk count, so a crash-resume from the oldest kept save
finds all its files. Each save's index is read as the replay reads it
(JSON, no pickle); one written as a pickle by an earlier version is read
only with `trust_pickle` (`run.trust_pickle`). When a save cannot be read,
nothing is deleted.
"""

import os

from embodied.core import checkpoint as cplib
from embodied.core import chunk as chunklib


def prune(replay_dir, checkpoint_dir, entry, trust_pickle=False):
    """Deletes the unneeded chunk files in `replay_dir`; returns how many.
    `entry` is the name the replay is saved under in each checkpoint."""
    if not replay_dir:
        return 0
    saves = []
    for tag in cplib.list_tags(checkpoint_dir):
        path = os.path.join(str(checkpoint_dir), f'{tag:012d}')
        try:
            data = cplib.read_entry(
                path, entry, trust_pickle, report=False)
            saves.append((data['time'], set(data['chunks'])))
        except Exception:
            return 0  # An unknown or unreadable save: keep everything.
    if not saves:
        return 0
    oldest = min(since for since, _ in saves)
    held = set().union(*(chunks for _, chunks in saves))
    removed = 0
    for name in os.listdir(str(replay_dir)):
        fields = chunklib.parse_filename(name)
        if not fields or fields['time'] >= oldest or (
                fields['uuid'].hex() in held):
            continue
        try:
            os.remove(os.path.join(str(replay_dir), name))
            removed += 1
        except FileNotFoundError:
            pass
    return removed
