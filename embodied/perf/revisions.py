"""The tree of an earlier git revision, for benchmarks that measure it side
by side with the working tree (`throughput --old`, `agent_speed --old`)."""

import pathlib
import subprocess

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent


def export(revision, path):
    """The tree of git `revision` of this checkout, written to the new folder
    `path`; returns `path`."""
    path.mkdir(parents=True)
    archive = subprocess.run(
        ['git', '-C', str(ROOT), 'archive', revision], check=True,
        capture_output=True).stdout
    subprocess.run(['tar', '-x', '-C', str(path)], input=archive, check=True)
    return path
