"""What the measurements take from a source checkout, and only when asked:
an earlier git revision of this checkout (`--old REV`: its tree, exported
with `git archive`) and the original's agent code
($EMBODIED_ORIGINAL_DREAMERV3: its `dreamerv3` package, copied). An
installed wheel has no git history: `--old` then ends the program with a
usage error saying so."""

import os
import pathlib
import subprocess
import sys

ORIGINAL_ENV = 'EMBODIED_ORIGINAL_DREAMERV3'
ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
AGENT_FILES = ('__init__.py', 'agent.py', 'rssm.py')


def original_checkout():
    """The original's checkout named by $EMBODIED_ORIGINAL_DREAMERV3, or ''."""
    return os.environ.get(ORIGINAL_ENV, '')


# The original's agent code.

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


# Earlier revisions of this checkout.

def export(revision, path):
    """The tree of git `revision` of this checkout, written to the new folder
    `path`; returns `path`."""
    path.mkdir(parents=True)
    archive = subprocess.run(
        ['git', '-C', str(ROOT), 'archive', revision], check=True,
        capture_output=True).stdout
    subprocess.run(['tar', '-x', '-C', str(path)], input=archive, check=True)
    return path


def trees(old, folder):
    """{label: tree}: this tree under '', and with `old` also that git
    revision's tree (exported into `folder`/old) under `old`, first. A
    revision git does not know, or no git checkout here, ends the program
    with a usage error."""
    if not old:
        return {'': ROOT}
    if not (ROOT / '.git').exists():
        print(f'--old {old} needs a git clone of embodied (this one, at '
              f'{ROOT}, has no git history): run it from a clone',
              file=sys.stderr)
        sys.exit(2)
    try:
        return {old: export(old, pathlib.Path(folder) / 'old'), '': ROOT}
    except subprocess.CalledProcessError as e:
        print(f'--old {old}: no such git revision here '
              f'({e.stderr.decode().strip()})', file=sys.stderr)
        sys.exit(2)
