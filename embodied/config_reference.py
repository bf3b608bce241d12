"""The parameter reference: every config key with its default and the
comment beside it in `configs/*.yaml`, grouped by section, and the config
blocks with the comment above them.

    python -m embodied.main --help                    # the keys, as text
    python -m embodied.main --configs atari gpu --help  # values after those blocks
    python -m embodied.config_reference --write       # refresh docs/configs.md
    python -m embodied.config_reference --check       # exit 1 if it is stale
                                                      # or a key has no comment

The text and the Markdown come from the same rows, so `--help` and
`docs/configs.md` cannot say different things. Every key of `defaults` needs
a comment of its own (`unexplained` names those without): a flow mapping
(`{a: 1, b: 2}`) carries one comment for all its keys, so the blocks of
`defaults` are written in block style, one key and its comment per line.
"""

import argparse
import pathlib
import sys

import ruamel.yaml as yaml

from embodied import config as configlib

START = '<!-- config-reference:start (python -m embodied.config_reference --write) -->'
END = '<!-- config-reference:end -->'
DOCS_PAGE = pathlib.Path(__file__).resolve().parent.parent / 'docs/configs.md'
TOP = 'top level'
USAGE = """\
usage: python -m embodied.main [--configs BLOCK ...] [--KEY VALUE ...]
       (also: embodied ..., python -m embodied.run.parallel ...)

--configs applies the blocks below in order on top of `defaults`; any key is
a flag (--run.steps 1e4). Values shown are the defaults after the --configs
given. (laptop): differs from the original to suit a CPU laptop; (ours): not
in the original. --replicas also takes 'auto' (the Slurm job step's tasks).
"""


def sections(config, directory=None):
    """[(section, section comment, [(key, value, comment)])] for every key
    of `config` (an elements.Config), in the YAML's order."""
    comments = _comments(directory)
    groups, shown = {TOP: []}, set()
    for key, value in config.flat.items():
        section = key.split('.', 1)[0] if '.' in key else TOP
        path = _commented(comments, key, section)
        # A mapping's comment goes beside its first key only.
        comment = comments[path] if path and path not in shown else ''
        shown.add(path)
        groups.setdefault(section, []).append((key, value, comment))
    return [(name, comments.get(name, '') if name != TOP else '', rows)
            for name, rows in groups.items()]


def unexplained(directory=None):
    """The keys of `defaults` that have no comment of their own (nor one of
    a mapping above them), in the order of the reference."""
    config = configlib.build([], configlib.load_blocks(directory))
    return [key for _, _, rows in sections(config, directory)
            for key, _, comment in rows if not comment]


def blocks(directory=None):
    """[(block, comment above its keys, {flat key: value})] for every block
    but `defaults`, merged over the YAML files."""
    merged = configlib.load_blocks(directory)
    notes = {}
    for filename in _files(directory):
        for name, block in _round_trip(filename).items():
            note = _leading_comment(block)
            if note:
                notes[name] = ' '.join(filter(None, (notes.get(name), note)))
    return [(name, notes.get(name, ''), merged[name])
            for name in sorted(merged) if name != 'defaults']


def help_text(config, directory=None):
    lines = [USAGE]
    for section, note, rows in sections(config, directory):
        lines.append(f'[{section}]' + (f'  {note}' if note else ''))
        width = max(len(key) for key, _, _ in rows) + 2
        for key, value, comment in rows:
            line = f'  --{key:<{width}} {_format(value)}'
            lines.append(f'{line:<{width + 24}} {comment}'.rstrip()
                         if comment else line)
        lines.append('')
    from embodied.outputs import registry as outputs
    from embodied.run import scripts
    lines.append('Scripts (--script NAME):')
    lines += [f'  {s.name:<17} {s.about}' for s in scripts.TABLE]
    lines += ['', 'Logger outputs (--logger.outputs NAME ...):']
    lines += [f'  {o.name:<17} {o.about}' for o in outputs.TABLE]
    from embodied import factories
    lines += ['', 'Env suites (--task SUITE_TASK):',
              '  ' + ', '.join(factories.SUITES),
              'Agents (--agent_impl NAME, or your own as module:Class):',
              '  ' + ', '.join(factories.AGENTS)]
    lines.append('')
    lines.append('Config blocks (--configs NAME ...):')
    for name, note, keys in blocks(directory):
        lines.append(f'  {name}: {note}' if note else f'  {name}')
        lines.append('      sets ' + ', '.join(
            f'{key}={_format(value)}' for key, value in keys.items()))
    return '\n'.join(lines)


def markdown(directory=None):
    """The generated part of docs/configs.md."""
    config = configlib.build([], configlib.load_blocks(directory))
    out = [START, '', '## All keys', '',
           'Generated from `configs/*.yaml` by '
           '`python -m embodied.config_reference --write`; '
           '`python -m embodied.main --help` prints the same.', '']
    for section, note, rows in sections(config, directory):
        out += [f'### {section}', '']
        if note:
            out += [_prose(note), '']
        out += ['| key | default | meaning |', '|---|---|---|']
        out += [f'| `{key}` | `{_cell(_format(value))}` | {_prose(comment)} |'
                for key, value, comment in rows]
        out.append('')
    from embodied.outputs import registry as outputs
    from embodied.run import scripts
    from embodied import factories
    out += ['## All scripts', '', scripts.markdown(), '',
            '## All logger outputs', '', outputs.markdown(), '',
            '## All env suites and agents', '',
            '`--task <suite>_<task>` builds the suite\'s class; '
            '`--agent_impl` names an agent (or `module:Class`).', '',
            '| `--task` suite / `--agent_impl` | class |', '|---|---|']
    out += [f'| `{name}` | `{path}` |'
            for name, path in {**factories.SUITES, **factories.AGENTS}.items()]
    out.append('')
    out += ['## All blocks', '', '| block | what it sets | note |',
            '|---|---|---|']
    for name, note, keys in blocks(directory):
        sets = ', '.join(f'`{key}={_cell(_format(value))}`'
                         for key, value in keys.items())
        out.append(f'| `{name}` | {sets} | {_prose(note)} |')
    out += ['', END]
    return '\n'.join(out)


def replace_generated(text, generated):
    """`text` with the part between the markers replaced by `generated`."""
    if START not in text or END not in text:
        raise ValueError(f'{DOCS_PAGE} lacks the markers {START} ... {END}.')
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return head + generated + tail


def _comments(directory):
    """{key path in `defaults`: its end-of-line comment}."""
    found = {}
    for filename in _files(directory):
        defaults = _round_trip(filename).get('defaults')
        if defaults:
            _collect(defaults, '', found)
    return found


def _collect(mapping, prefix, found):
    for key, value in mapping.items():
        path = f'{prefix}{key}'
        token = (mapping.ca.items.get(key) or [None] * 3)[2]
        if token is not None and token.value.strip().startswith('#'):
            found[path] = _text(token.value)
        if hasattr(value, 'ca') and hasattr(value, 'items'):
            _collect(value, f'{path}.', found)


def _commented(comments, key, section):
    """`key`, or the nearest mapping above it that has a comment and is not
    the section itself (`env.dummy` for `env.dummy.size`), or None."""
    parts = key.split('.')
    for end in range(len(parts), 0, -1):
        path = '.'.join(parts[:end])
        if path == section and end < len(parts):
            return None
        if path in comments:
            return path
    return None


def _leading_comment(block):
    tokens = getattr(getattr(block, 'ca', None), 'comment', None)
    if not tokens or not tokens[1]:
        return ''
    return _text(''.join(token.value for token in tokens[1]))


def _text(comment):
    lines = [line.strip().lstrip('#').strip() for line in comment.splitlines()]
    return ' '.join(line for line in lines if line)


def _files(directory):
    return sorted(pathlib.Path(directory or configlib.config_dir()).glob(
        '*.yaml'))


def _round_trip(filename):
    return yaml.YAML().load(pathlib.Path(filename).read_text()) or {}


def _format(value):
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        text = f'{value:g}'
        return text.replace('e+0', 'e').replace('e+', 'e').replace(
            'e-0', 'e-')
    if isinstance(value, str):
        return value if value else "''"
    if isinstance(value, (list, tuple)):
        return '[' + ', '.join(_format(item) for item in value) + ']'
    if isinstance(value, dict):
        return '{' + ', '.join(
            f'{key}: {_format(item)}' for key, item in value.items()) + '}'
    return str(value)


def _cell(text):
    return str(text).replace('|', '\\|')


def _prose(text):
    """A comment as a table cell: `<key>` placeholders shown, not read as
    HTML tags."""
    return _cell(text).replace('<', '&lt;').replace('>', '&gt;')


def main(argv=None):
    parser = argparse.ArgumentParser(
        description='Write or check the key reference in docs/configs.md.')
    parser.add_argument('--write', action='store_true')
    parser.add_argument('--check', action='store_true')
    parser.add_argument('--page', default=str(DOCS_PAGE))
    args = parser.parse_args(argv)
    page = pathlib.Path(args.page)
    current = page.read_text()
    wanted = replace_generated(current, markdown())
    if args.write:
        page.write_text(wanted)
        print(f'Wrote the key reference into {page}.')
    else:  # --check, the default
        if wanted != current:
            print(f'{page} is out of date with configs/*.yaml: run '
                  f'python -m embodied.config_reference --write',
                  file=sys.stderr)
            return 1
        print(f'{page} matches configs/*.yaml.')
    missing = unexplained()
    if missing:
        print(f'Keys without a comment in configs/*.yaml: '
              f'{", ".join(missing)}', file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
