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


def package_root(checkout, folder):
    """A folder whose `embodied/` is the original's package, for PYTHONPATH:
    the checkout itself when it is a work tree, else its HEAD's `embodied/`
    written into `folder` (a git directory)."""
    if is_worktree(checkout):
        return str(checkout)
    archive = subprocess.run(
        ['git', '--git-dir', checkout, 'archive', 'HEAD', 'embodied'],
        capture_output=True, check=True).stdout
    os.makedirs(folder, exist_ok=True)
    subprocess.run(['tar', '-x', '-C', folder], input=archive, check=True)
    return str(folder)


def own_tests(checkout):
    """{name: text} of the original's own unit tests, `embodied/tests/*.py`
    (their helper `utils.py` included)."""
    if is_worktree(checkout):
        folder = pathlib.Path(checkout) / 'embodied' / 'tests'
        return {p.name: p.read_text() for p in sorted(folder.glob('*.py'))}
    names = subprocess.run(
        ['git', '--git-dir', checkout, 'ls-tree', '--name-only', 'HEAD',
         'embodied/tests/'], capture_output=True, text=True,
        check=True).stdout.split()
    return {
        os.path.basename(name): read(checkout, name)
        for name in names if name.endswith('.py')}
