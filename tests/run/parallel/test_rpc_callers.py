"""Who calls each RPC method, read from the code: every role's `RPC`
declaration (from which docs/parallel.md's RPC table renders, see
test_rpc_table.py) must name exactly the modules whose code calls it.

An AST walk of `embodied/run/parallel/*.py` finds the client calls: a call
by name (`client.call('act', ...)`, `functools.partial(client.call,
f'sample_batch_{source}')`, the launcher's `self._call(role, 'save')`) or
through a client named after the role that serves the method
(`self.logger.add(...)`, `replay.add_batch(...)`, `self.updater.update`).
"""

import ast
import pathlib
import re

import pytest

from embodied.run.parallel import roles

PARALLEL = pathlib.Path(roles.__file__).parent

# Each calling module of the runner, as the `RPC` declarations name it.
CALLERS = {
    'actor.py': 'actor', 'learner.py': 'learner',
    'learner_replicas.py': 'learner', 'env.py': 'env workers',
    'replay.py': 'replay', 'lifecycle.py': 'launcher',
    'launcher.py': 'launcher', 'policy.py': 'policy process',
}

# The names the roles' clients go by in the calling code.
CLIENT_NAMES = {'logger': ('logger',), 'replay': ('replay', 'updater')}

# The launcher's helpers that call a role's method by name.
BY_NAME = ('call', '_call', '_try_call')


def served_methods():
    """{method: (role name, declared callers)} of every served class."""
    methods = {}
    for role in roles.SERVED:
        for cls in role.classes():
            for method, callers in cls.RPC.items():
                declared = {re.sub(r'\s*\(.*\)$', '', part.strip())
                            for part in callers.split(',')}
                methods.setdefault(method, {})[cls.__name__] = (
                    role.name, declared)
    return methods


def _terminal_name(node):
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ''


def _named(node, methods):
    """The methods a string or f-string argument names."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & set(methods)
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(
            node.values[0], ast.Constant):
        prefix = node.values[0].value
        return {m for m in methods if m.startswith(prefix)}
    return set()


def calls_in(source, methods):
    """The RPC methods that the module `source` calls."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = _terminal_name(func)
        if name in BY_NAME:  # client.call('m'), self._call(role, 'm')
            for arg in node.args[:2]:
                found |= _named(arg, methods)
        elif name == 'partial' and node.args and _terminal_name(
                node.args[0]) == 'call':
            for arg in node.args[1:2]:
                found |= _named(arg, methods)
        if isinstance(func, ast.Attribute) and func.attr in methods:
            receiver = _terminal_name(func.value).lower()
            for role_name, _ in methods[func.attr].values():
                names = CLIENT_NAMES.get(role_name, ())
                if any(receiver.endswith(n) for n in names):
                    found.add(func.attr)
    return found


def callers_by_method():
    methods = served_methods()
    found = {}
    for filename, caller in CALLERS.items():
        source = (PARALLEL / filename).read_text()
        for method in calls_in(source, methods):
            found.setdefault(method, set()).add(caller)
    return methods, found


def test_each_rpc_declaration_names_the_modules_that_call_it():
    methods, found = callers_by_method()
    wrong = []
    for method, classes in sorted(methods.items()):
        for cls, (_, declared) in classes.items():
            if declared != found.get(method, set()):
                wrong.append(
                    f'{cls}.RPC[{method!r}] says {sorted(declared)}, the '
                    f'code calls it from {sorted(found.get(method, ()))}')
    assert not wrong, '\n'.join(wrong)


@pytest.mark.parametrize('source, method, called', [
    ("self.logger.add({'a': 1})", 'add', True),
    ("client.call('act', obs)", 'act', True),
    ("functools.partial(client.call, f'sample_batch_{s}')",
     'sample_batch_eval', True),
    ("self._try_call(role, 'save', 5)", 'save', True),
    ("self.agg.add(mets)", 'add', False),
    ("batch.update(self.fixed)", 'update', False),
])
def test_the_walk_tells_client_calls_from_other_calls(source, method, called):
    assert (method in calls_in(source, served_methods())) == called
