"""Imports a suite's third-party package when its env is built, or stops the
run with one line that names the extra to install."""

import importlib

from embodied.config import UsageError


class MissingPackage(UsageError):
    """A suite's package is not installed; the message says how to get it.
    A usage error: `embodied.main` prints it and exits with status 2."""


def need(module, task, extra, package=None, how=''):
    """Returns the imported `module`, or raises MissingPackage naming the
    task, `pip install 'embodied[extra]'` (unless `extra` is None: a
    package pip cannot install) and, in `how`, what the package needs
    beyond pip. An ImportError from inside an installed package (a broken
    install) propagates as it is."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        root = module.split('.')[0]
        if e.name is None or e.name.split('.')[0] != root:
            raise
    package = package or root
    if extra is None:
        raise MissingPackage(
            f'--task {task} needs {package}, which is not installed. {how}')
    how = f' {how}' if how else ''
    raise MissingPackage(
        f"--task {task} needs {package}, which is not installed: "
        f"pip install 'embodied[{extra}]'.{how}")
