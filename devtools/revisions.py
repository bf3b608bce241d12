"""The tree of an earlier git revision, for benchmarks that measure it side
by side with the working tree (`throughput --old`, `agent_speed --old`)."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


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
    """{label: tree}: the working tree under '', and with `old` also that
    revision's tree (exported into `folder`/old) under `old`, first. A
    revision git does not know ends the program with a usage error."""
    if not old:
        return {'': ROOT}
    try:
        return {old: export(old, pathlib.Path(folder) / 'old'), '': ROOT}
    except subprocess.CalledProcessError as e:
        print(f'--old {old}: no such git revision here '
              f'({e.stderr.decode().strip()})', file=sys.stderr)
        sys.exit(2)
