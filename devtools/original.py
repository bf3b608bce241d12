"""Access to a checkout of the original danijar/dreamerv3 (for tests and
benchmarks that run its code; it is not part of this package)."""

import os
import pathlib
import subprocess

ENV = 'EMBODIED_ORIGINAL_DREAMERV3'
AGENT_FILES = ('__init__.py', 'agent.py', 'rssm.py')


def source():
    """The checkout named by $EMBODIED_ORIGINAL_DREAMERV3, or ''."""
    return os.environ.get(ENV, '')


def copy_agent(checkout, target):
    """Copies the original's `dreamerv3` agent package (agent.py, rssm.py)
    into `target/dreamerv3`, importable as `dreamerv3.agent:Agent` with
    `target` on the path. `checkout` is a work tree or a git directory."""
    package = pathlib.Path(target) / 'dreamerv3'
    package.mkdir(parents=True)
    for name in AGENT_FILES:
        (package / name).write_text(read(checkout, f'dreamerv3/{name}'))
    return package


def read(checkout, path):
    """A file of the checkout (a work tree, or a git directory's HEAD)."""
    full = os.path.join(checkout, path)
    if os.path.exists(full):
        with open(full) as f:
            return f.read()
    return subprocess.run(
        ['git', '--git-dir', checkout, 'show', f'HEAD:{path}'],
        capture_output=True, text=True, check=True).stdout


def is_worktree(checkout):
    """Whether the checkout has files on disk (needed to import the
    original's own `embodied` package)."""
    return os.path.isdir(os.path.join(checkout, 'embodied', 'jax'))
