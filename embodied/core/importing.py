"""Loads the object a 'package.module:attr' string names.

The one loader behind every such string: the suites' env classes and the
agents of `embodied.factories`, the entry points of the roles table
(`embodied.run.parallel.roles`) and a user's own env (`--task module:attr`,
`embodied.envs.own`, which words its errors for the command line).
"""

import importlib


class MissingAttribute(AttributeError):
    """The module imported but holds no `part` on the way to the attribute.

    owner: the object that lacks it (a module, a class, ...).
    part: the missing name."""

    def __init__(self, path, owner, part):
        super().__init__(f"Cannot load '{path}': {owner!r} has no attribute "
                         f"'{part}'")
        self.owner = owner
        self.part = part


def split(path):
    """('package.module', 'attr') of 'package.module:attr'."""
    module, sep, attr = path.partition(':')
    if not sep or not module or not attr:
        raise ValueError(f"'{path}' does not name module:attr")
    return module, attr


def load(path, module=None):
    """The object `path` names; `attr` may be dotted ('module:Class.make').
    `module`, if given, is the already imported module of `path`. Raises
    what the import raises, or `MissingAttribute`."""
    name, attr = split(path)
    value = module if module is not None else importlib.import_module(name)
    for part in attr.split('.'):
        if not hasattr(value, part):
            raise MissingAttribute(path, value, part)
        value = getattr(value, part)
    return value
