"""`tether`: a child and its process group end with the parent, however the
parent ends; the child gets SIGTERM first (a run saves), SIGKILL after the
grace."""

import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from embodied.core import tether

ROOT = str(pathlib.Path(__file__).resolve().parents[2])

# A command that prints its pid and a grandchild's (which ignores SIGTERM),
# notes a SIGTERM in the file argv[1] and then exits, and otherwise sleeps.
# argv[2] 'deaf': it ignores SIGTERM as the grandchild does (in the kernel,
# so that no test waits on a busy machine's scheduler to see it ignored);
# 'leave': it ends at once, leaving the grandchild behind.
CHILD = textwrap.dedent('''
    import os, signal, subprocess, sys, time
    note, mode = sys.argv[1], sys.argv[2]
    def on_term(*_):
        open(note, 'a').write('SIGTERM\\n')
        os._exit(0)
    signal.signal(signal.SIGTERM,
                  signal.SIG_IGN if mode == 'deaf' else on_term)
    grandchild = subprocess.Popen([sys.executable, '-c',
        'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);'
        ' time.sleep(600)'])
    print(os.getpid(), grandchild.pid, flush=True)
    if mode == 'leave':
        sys.exit(0)  # Ends, leaving the grandchild behind.
    time.sleep(600)
''')

# A parent that starts CHILD tethered, prints its line, and sleeps.
PARENT = textwrap.dedent('''
    import sys, time
    from embodied.core import tether
    proc = tether.popen(['-c', sys.argv[1], *sys.argv[2:4]],
                        grace=float(sys.argv[4]), stdout=sys.stdout)
    time.sleep(600)
''')


def alive(pids):
    result = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                result.append(pid)
        except psutil.NoSuchProcess:
            pass
    return result


def wait_gone(pids, timeout):
    """Seconds until every pid has gone, or None after `timeout`."""
    start = time.monotonic()
    while alive(pids):
        if time.monotonic() - start > timeout:
            return None
        time.sleep(0.05)
    return time.monotonic() - start


def start_parent(tmp_path, mode, grace):
    proc = subprocess.Popen(
        [sys.executable, '-c', PARENT, CHILD, str(tmp_path / 'note'), mode,
         str(grace)], stdout=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPATH=ROOT))
    pids = [int(x) for x in proc.stdout.readline().split()]
    assert len(pids) == 2
    return proc, pids


@pytest.mark.parametrize('mode', ['exit', 'deaf'])
def test_sigkill_of_the_parent_ends_the_child_and_its_group(tmp_path, mode):
    # A child that exits on SIGTERM goes at once, however long the grace.
    grace = 2 if mode == 'deaf' else 60
    parent, pids = start_parent(tmp_path, mode, grace=grace)
    try:
        parent.kill()
        parent.wait()
        seconds = wait_gone(pids, 30)
        assert seconds is not None, alive(pids)
        if mode == 'exit':  # SIGTERM first: the child noted it.
            assert (tmp_path / 'note').read_text() == 'SIGTERM\n'
        else:  # A child that ignores it goes after the grace.
            assert seconds >= 1.5
            assert not (tmp_path / 'note').exists()
    finally:
        parent.stdout.close()
        for pid in alive(pids):
            os.kill(pid, signal.SIGKILL)


def test_a_child_that_ends_leaves_nothing_of_its_group(tmp_path):
    proc = tether.popen(
        ['-c', CHILD, tmp_path / 'note', 'leave'], stdout=subprocess.PIPE,
        text=True)
    try:
        pids = [int(x) for x in proc.stdout.readline().split()]
        assert proc.wait(30) == 0
        assert wait_gone(pids[1:], tether.LINGER + 10) is not None
        assert not (tmp_path / 'note').exists()  # No SIGTERM was needed.
    finally:
        tether.end(proc, grace=0)
        proc.stdout.close()


def test_end_sends_sigterm_first_then_kills_the_group(tmp_path):
    proc = tether.popen(
        ['-c', CHILD, tmp_path / 'note', 'exit'], stdout=subprocess.PIPE,
        text=True)
    pids = [int(x) for x in proc.stdout.readline().split()]
    # The child exits on the SIGTERM (0, not -SIGKILL: well before the
    # grace); the grandchild, which ignores it, is killed with the group.
    assert tether.end(proc, grace=60) == 0
    assert (tmp_path / 'note').read_text() == 'SIGTERM\n'
    assert wait_gone(pids, 5) is not None
    assert proc.lifeline is None
    proc.stdout.close()


def test_end_kills_what_ignores_sigterm_after_the_grace(tmp_path):
    proc = tether.popen(
        ['-c', CHILD, tmp_path / 'note', 'deaf'], stdout=subprocess.PIPE,
        text=True)
    pids = [int(x) for x in proc.stdout.readline().split()]
    start = time.monotonic()
    assert tether.end(proc, grace=1) == -signal.SIGKILL
    assert time.monotonic() - start >= 0.9
    assert wait_gone(pids, 5) is not None
    assert proc.lifeline is None
    proc.stdout.close()


def test_run_past_its_timeout_leaves_nothing(tmp_path):
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        tether.run(['-c', CHILD, tmp_path / 'note', 'deaf'], timeout=3,
                   capture_output=True, text=True)
    pids = [int(x) for x in caught.value.output.split()]
    assert len(pids) == 2
    assert wait_gone(pids, 5) is not None


def test_modules_and_code_run_as_python_runs_them(tmp_path):
    (tmp_path / 'mod.py').write_text(
        'import sys\nprint(__name__, sys.argv[1:], sys.path[0])\n')
    result = tether.run(['-m', 'mod', 'a', 'b'], cwd=tmp_path,
                        capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"__main__ ['a', 'b'] {tmp_path}\n"
    result = tether.run(
        ['-c', 'import sys; print(__name__, sys.argv); sys.exit(3)', 'x'],
        capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout) == (3, "__main__ ['-c', 'x']\n")
    with pytest.raises(ValueError, match="'-m MODULE' or '-c CODE'"):
        tether.popen(['script.py'])
