"""`broken_streams`: a stdout or stderr whose reader went away fails no
print; what follows goes to the fallback file, and listeners hear of it."""

import errno
import io
import os
import subprocess
import sys
import textwrap

import pytest

from embodied.core import linewise

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))

# Prints a line, waits for the parent to close the pipe's reading end, then
# prints and flushes more; the listener's calls go to a file of their own.
CHILD = textwrap.dedent('''
    import sys, time
    from embodied.core import broken_streams, linewise
    linewise.install()
    fallback, heard, how = sys.argv[1], sys.argv[2], sys.argv[3]
    if fallback != '-':
        broken_streams.set_fallback(fallback)
    broken_streams.on_lost(
        lambda names, why: open(heard, 'a').write(f'{names} {why}\\n'))
    print('first', flush=True)
    sys.stdin.readline()  # The parent closed the pipe by now.
    if how == 'poll':
        print('lost by poll:', broken_streams.poll(), file=sys.stderr)
    for index in range(3):
        print(f'after {index}', flush=True)
        print(f'error {index}', file=sys.stderr, flush=True)
    print('unflushed at exit')
''')


def run_child(tmp_path, how='write', split=False, unbuffered=True,
              fallback=True):
    """Runs CHILD with stdout (and stderr, unless `split`) on a pipe whose
    reading end closes after the first line; returns the exit code, the
    fallback's text, the listener's calls and the child's own stderr."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop('PYTHONUNBUFFERED', None)
    if unbuffered:
        env['PYTHONUNBUFFERED'] = '1'
    path = tmp_path / 'broken_pipe.log'
    heard = tmp_path / 'heard'
    errors = open(tmp_path / 'stderr', 'w')
    read, write = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, '-c', CHILD, str(path) if fallback else '-',
         str(heard), how], stdin=subprocess.PIPE, stdout=write,
        stderr=errors if split else write, env=env, text=True)
    os.close(write)
    with os.fdopen(read) as pipe:
        assert pipe.readline() == 'first\n'
    proc.stdin.write('go\n')
    proc.stdin.close()
    code = proc.wait(60)
    errors.close()
    text = lambda p: p.read_text() if p.exists() else ''
    return code, text(path), text(heard), text(tmp_path / 'stderr')


@pytest.mark.parametrize('unbuffered', [True, False])
def test_a_closed_pipe_sends_both_streams_to_the_fallback(
        tmp_path, unbuffered):
    code, fallback, heard, _ = run_child(tmp_path, unbuffered=unbuffered)
    assert code == 0, fallback  # No BrokenPipeError, no exit 120.
    lines = fallback.splitlines()
    assert 'its stdout and stderr lost their reader (broken pipe)' in lines[0]
    assert '(pid ' in lines[0]
    for index in range(3):
        assert f'after {index}' in lines and f'error {index}' in lines
    assert lines[-1] == 'unflushed at exit'  # The interpreter's last flush.
    assert not [x for x in lines if 'Traceback' in x or 'Exception' in x]
    assert heard == "['stdout', 'stderr'] broken pipe\n"  # Told once.


def test_only_the_stream_that_broke_moves(tmp_path):
    code, fallback, heard, stderr = run_child(tmp_path, split=True)
    assert code == 0
    assert 'its stdout lost its reader (broken pipe)' in fallback
    assert 'after 2' in fallback and 'error' not in fallback
    assert [f'error {i}' for i in range(3)] == stderr.splitlines()
    assert heard == "['stdout'] broken pipe\n"


def test_poll_notices_a_closed_pipe_before_any_write(tmp_path):
    code, fallback, heard, _ = run_child(tmp_path, how='poll')
    assert code == 0
    assert 'pipe closed by its reader' in fallback.splitlines()[0]
    assert "lost by poll: ['stdout', 'stderr']" in fallback
    assert heard == "['stdout', 'stderr'] pipe closed by its reader\n"


def test_without_a_fallback_the_output_goes_nowhere(tmp_path):
    code, fallback, heard, _ = run_child(tmp_path, fallback=False)
    assert code == 0
    assert fallback == ''
    assert heard == "['stdout', 'stderr'] broken pipe\n"


def test_other_write_errors_are_raised():
    class Full(io.StringIO):
        def write(self, text):
            raise OSError(errno.ENOSPC, 'No space left on device')
    writer = linewise.LineWriter(Full())
    with pytest.raises(OSError, match='No space left'):
        print('a line', file=writer)
