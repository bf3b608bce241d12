"""`linewise`: whole lines, however many threads print."""

import io
import subprocess
import sys
import textwrap
import threading

from embodied.core import linewise


class Recorder(io.StringIO):
    """A stream that keeps each `write` call apart."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def write(self, text):
        self.calls.append(text)
        return super().write(text)


def test_threads_printing_at_once_give_whole_lines():
    stream = Recorder()
    writer = linewise.LineWriter(stream)
    start = threading.Barrier(4)

    def talk(index):
        start.wait()
        for count in range(300):
            print(f'thread {index} line {count}', file=writer)
    threads = [threading.Thread(target=talk, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1200
    assert set(lines) == {
        f'thread {i} line {c}' for i in range(4) for c in range(300)}
    assert all(call.endswith('\n') for call in stream.calls)


def test_text_without_a_newline_waits_for_it_or_a_flush():
    stream = Recorder()
    writer = linewise.LineWriter(stream)
    writer.write('Compiling ')
    assert stream.getvalue() == ''
    writer.write('train\nand ')
    assert stream.getvalue() == 'Compiling train\n'
    writer.flush()
    assert stream.getvalue() == 'Compiling train\nand '


def test_install_wraps_stdout_and_stderr_once():
    code = textwrap.dedent('''
        import sys
        from embodied.core import linewise
        linewise.install()
        linewise.install()
        assert isinstance(sys.stdout, linewise.LineWriter)
        assert not isinstance(sys.stdout.stream, linewise.LineWriter)
        assert isinstance(sys.stderr, linewise.LineWriter)
        print('out', end='')
        print('err', file=sys.stderr)
        sys.stdout.fileno()
    ''')
    result = subprocess.run([sys.executable, '-c', code], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == 'out'  # Written by the flush at exit.
    assert result.stderr == 'err\n'
