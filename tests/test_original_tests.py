"""Conformance: the original's own unit tests (danijar/dreamerv3's
`embodied/tests/*.py`) pass on this package wherever they pass on the
original's package.

The test files are copied into a temporary folder and run there with
pytest twice, in two subprocesses at once: with `import embodied`
resolving to this package, and to the original's (`PYTHONPATH` names only
that package's folder). Per-test outcomes come from pytest's JUnit XML. The
test fails for every test that passes on the original and not here; it
prints a table per file and each test that fails on the original too, with
the original's reason in one line (see it with `-s` or `-rP`).

Run with a checkout of danijar/dreamerv3 (a work tree or its git
directory) in EMBODIED_ORIGINAL_DREAMERV3; skipped otherwise. The
original's package imports in this environment as its tests need it, with
`zerofun` (which its `test_train`, `test_parallel` and their `utils.py`
import) installed; without `zerofun` those files fail to collect on both
sides. docs/compatibility.md has the table and why the rest fail.
"""

import collections
import os
import pathlib
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from embodied.perf import checkout as original

SOURCE = original.original_checkout()
ROOT = pathlib.Path(__file__).resolve().parent.parent
# A test that hangs (the original's parallel runner never stops by itself)
# fails after this many seconds; the whole run of one side after WALL.
PER_TEST = 120
WALL = 900

pytestmark = [
    pytest.mark.skipif(
        not SOURCE, reason='EMBODIED_ORIGINAL_DREAMERV3 is not set'),
    pytest.mark.slow,
]


def test_every_test_passing_on_the_original_passes_here(tmp_path):
    package = original.package_root(SOURCE, tmp_path / 'package')
    files = original.own_tests(SOURCE)
    assert any(name.startswith('test_') for name in files), (
        f'no test files in {SOURCE}/embodied/tests')
    sides = {'original': package, 'ours': str(ROOT)}
    runs = {side: start(tmp_path / side, files, root)
            for side, root in sides.items()}
    outcomes = {side: finish(*run) for side, run in runs.items()}
    orig, ours = outcomes['original'], outcomes['ours']
    print(report(files, orig, ours))

    passed = [name for name, (outcome, _) in orig.items()
              if outcome == 'passed']
    # Guards against a comparison that cannot fail: the original's package
    # must have run and passed tests of its own.
    assert passed, 'no test passed on the original:\n' + report(
        files, orig, ours)
    broken = [
        f'{name}: {ours.get(name, ("not run", "not collected here"))[1]}'
        for name in passed if ours.get(name, ('',))[0] != 'passed']
    assert not broken, (
        f'{len(broken)} tests pass on the original and not here:\n'
        + '\n'.join(broken))


def start(folder, files, package):
    """Starts pytest on copies of `files` in `folder` with `package` (the
    folder holding an `embodied/`) as the only PYTHONPATH entry."""
    tests = folder / 'tests'
    tests.mkdir(parents=True)
    for name, text in files.items():
        (tests / name).write_text(text)
    env = {
        **os.environ, 'PYTHONPATH': str(package), 'JAX_PLATFORMS': 'cpu',
        # Nothing written into the checkouts.
        'PYTHONDONTWRITEBYTECODE': '1'}
    xml = folder / 'results.xml'
    command = [
        sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider',
        '--continue-on-collection-errors', f'--timeout={PER_TEST}',
        f'--junitxml={xml}', f'--basetemp={folder / "tmp"}', '.']
    log = open(folder / 'output.txt', 'w')
    proc = subprocess.Popen(
        command, cwd=tests, env=env, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True)
    return proc, log, xml


def finish(proc, log, xml):
    """{test id: (outcome, one-line reason)} of a run begun by `start`."""
    try:
        proc.wait(WALL)
    except subprocess.TimeoutExpired:
        pass
    finally:
        # The run's own processes go too (an env or server it left behind).
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        log.close()
    output = pathlib.Path(log.name).read_text()
    assert proc.returncode in (0, 1) and xml.exists(), (
        f'pytest exited {proc.returncode} in {xml.parent}:\n{output[-3000:]}')
    return outcomes(xml)


def outcomes(xml):
    result = {}
    for case in ET.parse(xml).iter('testcase'):
        module = case.get('classname', '').split('.')[0]
        name = f"{module}::{case.get('name')}" if module else case.get('name')
        problem = next(
            (case.find(tag) for tag in ('failure', 'error', 'skipped')
             if case.find(tag) is not None), None)
        if problem is None:
            result[name] = ('passed', '')
        elif problem.tag == 'skipped':
            result[name] = ('skipped', one_line(problem))
        else:
            result[name] = ('failed', one_line(problem))
    return result


def one_line(element):
    """The reason of a failure: its message, or for a generic one (a
    collection error) the last `E ` line of its traceback."""
    message = (element.get('message') or '').strip().split('\n')[0]
    if message in ('', 'collection failure'):
        lines = [line[1:].strip() for line in (element.text or '').split('\n')
                 if line.startswith('E ')]
        message = lines[-1] if lines else message
    return message[:200]


def report(files, orig, ours):
    """The per-file table and the tests that fail on the original too."""
    def counts(results, module):
        tally = collections.Counter(
            outcome for name, (outcome, _) in results.items()
            if name.split('::')[0] == module)
        return f"{tally['passed']} / {tally['failed']}"
    lines = ['| file | original: passed / failed | ours: passed / failed |',
             '|---|---|---|']
    for name in files:
        if name.startswith('test_'):
            module = name[:-3]
            lines.append(
                f'| {module} | {counts(orig, module)} | '
                f'{counts(ours, module)} |')
    failing = [(name, reason) for name, (outcome, reason) in orig.items()
               if outcome == 'failed']
    lines.append(f'\nFailing on the original too ({len(failing)}), with its '
                 f'reason; here:')
    for name, reason in sorted(failing):
        here = ours.get(name, ('not run', ''))
        lines.append(f'- {name}: {reason} [here: {here[0]}]')
    return '\n'.join(lines)
