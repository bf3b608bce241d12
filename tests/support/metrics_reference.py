"""The metric keys of docs/metrics.md as patterns, to check what a run
logged against the page.

    metrics_reference.check(metrics_reference.logged(logdir))

The keys are the backticked names in the first column of the page's tables:
`<name>` matches any name (observation keys may hold '/'), `*` any rest of
the key and `{a,b}` either word.
"""

import json
import pathlib
import re

PAGE = pathlib.Path(__file__).resolve().parents[2] / 'docs' / 'metrics.md'
FILES = ('metrics.jsonl', 'scores.jsonl')


def patterns(page=PAGE):
    """{pattern as written on the page: compiled regex}."""
    found = {}
    for line in pathlib.Path(page).read_text().splitlines():
        cells = line.split('|')
        if not line.startswith('|') or len(cells) < 3:
            continue
        first = cells[1].strip()
        if first == 'key' or set(first) <= set('-: '):
            continue  # The header and its separator.
        for pattern in re.findall(r'`([^`]+)`', first):
            found[pattern] = to_regex(pattern)
    return found


def to_regex(pattern):
    parts = re.split(r'(<[^<>]+>|\*|\{[^{}]+\})', pattern)
    out = []
    for part in parts:
        if part.startswith('<'):
            out.append('.+')
        elif part == '*':
            out.append('.*')
        elif part.startswith('{'):
            words = part[1:-1].split(',')
            out.append('(?:' + '|'.join(map(re.escape, words)) + ')')
        else:
            out.append(re.escape(part))
    return re.compile(''.join(out))


def undocumented(keys, page=PAGE):
    """The keys that match no pattern of the page, sorted."""
    regexes = list(patterns(page).values())
    return sorted(
        key for key in keys
        if not any(regex.fullmatch(key) for regex in regexes))


def check(keys, page=PAGE):
    """Fails, naming them, when some of `keys` are not on the page."""
    missing = undocumented(keys, page)
    assert not missing, (
        f'Keys the run logged that {pathlib.Path(page).name} does not '
        f'name: {missing}')


def logged(logdir):
    """Every key of the run's metrics.jsonl and scores.jsonl."""
    keys = set()
    for name in FILES:
        path = pathlib.Path(logdir) / name
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            try:
                keys.update(json.loads(line))
            except json.JSONDecodeError:
                pass  # A line being written, or cut short by a kill.
    return keys
