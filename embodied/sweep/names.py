"""The folder name of a sweep's run: `<index>-<task>-<method>-<seed>`, the
layout the original's `plot.py` reads (it splits a run folder's name at
`-` into exactly four parts).

So that the name always has exactly three `-`, a task or method is written
with every character other than letters, digits and `_.,=+:@` as `%XX`
(its UTF-8 bytes in hex), as in a URL: `gym_CartPole-v1` is written
`gym_CartPole%2Dv1`, and a `%` of the name itself `%25`. `parse` undoes
it, so a name read back is the task and method the run was given.

    folder(0, 'gym_CartPole-v1', 'dreamerv3', 1)
    # '0-gym_CartPole%2Dv1-dreamerv3-1'
    parse('0-gym_CartPole%2Dv1-dreamerv3-1')
    # Name(index=0, task='gym_CartPole-v1', method='dreamerv3', seed=1)
"""

import re
import typing
import urllib.parse

SAFE = '_.,=+:@'
_PART = re.compile(r'^[A-Za-z0-9_.,=+:@%]+$')


class Name(typing.NamedTuple):
    """A run folder's name, read back."""
    index: int
    task: str
    method: str
    seed: int


def escape(text):
    """`text` with every character other than letters, digits and
    `_.,=+:@` as `%XX`."""
    # quote() keeps `-` and `~` too; they are written %XX here (a `-` would
    # split the name, `~` reads as a home folder in a shell).
    return urllib.parse.quote(str(text), safe=SAFE).replace(
        '-', '%2D').replace('~', '%7E')


def folder(index, task, method, seed):
    """The folder name of run `index` of a sweep."""
    index, seed = int(index), int(seed)
    if index < 0 or seed < 0:
        raise ValueError(
            f'A run folder needs an index and seed of at least 0, not '
            f'{index} and {seed} (a `-` would split its name).')
    return f'{index}-{escape(task)}-{escape(method)}-{seed}'


def parse(name):
    """The index, task, method and seed of a run folder's name, or None for
    a name not in the layout (a folder of something else)."""
    parts = str(name).split('-')
    if len(parts) != 4:
        return None
    index, task, method, seed = parts
    if not (index.isdigit() and seed.isdigit() and _PART.match(task)
            and _PART.match(method)):
        return None
    try:
        task = urllib.parse.unquote(task, errors='strict')
        method = urllib.parse.unquote(method, errors='strict')
    except UnicodeDecodeError:
        return None
    return Name(int(index), task, method, int(seed))


def task_method_seed(name):
    """`(task, method, seed)` of a run folder's name, or None: what the
    original's `plot.py` reads from it, with the task's and method's
    escapes undone."""
    parsed = parse(name)
    return None if parsed is None else parsed[1:]
