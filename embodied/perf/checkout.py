"""What the measurements take from a source checkout of embodied, and only
when asked: an earlier git revision (`--old REV`) and the original's agent
code ($EMBODIED_ORIGINAL_DREAMERV3). Both live in the checkout's `devtools/`
folder, which the wheel does not hold."""

import importlib
import os
import pathlib
import sys

ORIGINAL_ENV = 'EMBODIED_ORIGINAL_DREAMERV3'
ROOT = pathlib.Path(__file__).resolve().parent.parent.parent


def original_checkout():
    """The original's checkout named by $EMBODIED_ORIGINAL_DREAMERV3, or ''."""
    return os.environ.get(ORIGINAL_ENV, '')


def devtool(name, asked):
    """The module `devtools.<name>` of this checkout; without one (an
    installed wheel), ends the program with a usage error naming `asked`,
    what needed it."""
    if (ROOT / 'devtools' / f'{name}.py').is_file() and str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))
    try:
        return importlib.import_module(f'devtools.{name}')
    except ModuleNotFoundError as e:
        if e.name not in ('devtools', f'devtools.{name}'):
            raise
    print(f'{asked} needs a source checkout of embodied (its devtools/ '
          f'folder): run this from a git clone', file=sys.stderr)
    sys.exit(2)


def trees(old, folder):
    """{label: tree}: this tree under '', and with `old` also that git
    revision's tree under `old`, first (`devtools.revisions.trees`)."""
    if not old:
        return {'': ROOT}
    return devtool('revisions', f'--old {old}').trees(old, folder)
