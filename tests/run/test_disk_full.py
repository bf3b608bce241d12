"""A full disk (or quota, or read-only logdir) ends a run with one line that
names the path, the bytes free and the last complete save, exit code 74,
and a rerun with space resumes from that save."""

import contextlib
import errno
import os
import re
import subprocess

import elements
import numpy as np
import pytest

import launch
from embodied.core import checkpoint as cplib
from embodied.core import diskfull
from embodied.core import replay as replaylib
from embodied.run import saving
from tests.run.parallel.test_parallel import COMMON, Tree, finish

FLAGS = (*COMMON, '--run.envs', '2', '--run.save_every', '2')
SCRIPT_FLAGS = {
    'train': ('--run.eval_envs', '0'),
    'train_eval': ('--run.eval_envs', '1'),
    'parallel': ('--run.eval_envs', '0'),
}


def full(path='/x/file'):
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)


def test_find_reads_errors_that_crossed_a_process():
    from embodied import rpc
    error = full('/data/run/ckpt/replay/000000000100/replay.json')
    remote = rpc.RemoteError(f'Replay.save failed: OSError: {error}')
    found = diskfull.find(remote)
    assert (found.errno, found.filename) == (errno.ENOSPC, error.filename)
    worker = rpc.WorkerFailed(
        'Logger', 74, f'OSError: {OSError(errno.EROFS, "Read-only", "/m")}')
    assert diskfull.find(worker).errno == errno.EROFS
    assert diskfull.find(worker).filename == '/m'
    try:
        try:
            raise error
        except OSError as e:
            raise RuntimeError('save failed') from e
    except RuntimeError as e:
        assert diskfull.find(e) is error
    assert diskfull.find(FileNotFoundError(2, 'gone', '/x')) is None
    assert diskfull.find(RuntimeError('[Errno 2] No such file')) is None


def test_writing_names_the_path_a_write_did_not():
    with pytest.raises(OSError) as info:
        with diskfull.writing('/logdir/metrics.jsonl'):
            raise OSError(errno.EDQUOT, 'Disk quota exceeded')
    assert info.value.filename == '/logdir/metrics.jsonl'
    with pytest.raises(PermissionError) as info:  # Other errors untouched.
        with diskfull.writing('/logdir/x'):
            raise PermissionError(errno.EACCES, 'denied')
    assert info.value.filename is None


def test_message_names_path_free_bytes_and_last_save(tmp_path):
    line = diskfull.message(full(str(tmp_path / 'a.pkl')), tmp_path, 1200)
    assert str(tmp_path / 'a.pkl') in line
    free = diskfull.free_bytes(tmp_path)
    assert f'{free} bytes free' in line
    assert f'step 1200 in {tmp_path / "ckpt"}, is intact' in line
    assert '\n' not in line
    line = diskfull.message(full(None), tmp_path, None)
    assert 'no complete save' in line and str(tmp_path) in line


class FullAfter:
    """`os.fsync` that raises ENOSPC from its `count`-th call on."""

    def __init__(self, count):
        self.count = count
        self.real = os.fsync

    def __call__(self, fd):
        self.count -= 1
        if self.count < 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self.real(fd)


class Value:

    def save(self):
        return {'pad': b'x' * 100}

    def load(self, data):
        pass


def test_save_that_finds_no_room_leaves_the_older_save(tmp_path, monkeypatch):
    cp = cplib.Checkpoint(tmp_path / 'ckpt', keep=2)
    cp.agent = Value()
    cp.save(100)
    monkeypatch.setattr(os, 'fsync', FullAfter(0))
    with pytest.raises(OSError) as info:
        cp.save(200)
    # Named by the file the save writes, not its temporary folder.
    assert info.value.filename == str(tmp_path / 'ckpt' / '000000000200' /
                                      'agent.safetensors')
    assert cp.tags() == [100]
    assert os.listdir(tmp_path / 'ckpt') == ['000000000100']


def test_replay_save_raises_a_chunk_write_that_found_no_room(
        tmp_path, monkeypatch, capsys):
    replay = replaylib.Replay(length=4, capacity=100, directory=tmp_path,
                              chunksize=8)
    for i in range(12):
        replay.add({'x': np.float32(i), 'is_first': i == 0}, worker=0)
    monkeypatch.setattr(os, 'fsync', FullAfter(0))
    replay.save()  # The chunk files are written in the background.
    replay._files.wait()
    with pytest.raises(OSError) as info:
        replay.save()
    assert diskfull.is_full(info.value)
    assert str(tmp_path) in info.value.filename
    assert 'could not save' not in capsys.readouterr().out
    replay.close()


def test_train_with_a_full_disk_ends_with_one_line_and_resumes(
        tmp_path, monkeypatch, capsys):
    """Without a small file system: the error injected into the writer of
    the second replay save of `--script train`, in this process."""
    from embodied import main
    logdir = tmp_path / 'run'
    def argv(steps):  # run.debug: the envs in this process.
        return ['--script', 'train', *FLAGS, *SCRIPT_FLAGS['train'],
                '--logdir', str(logdir), '--run.steps', str(steps),
                '--run.debug', 'True']
    write = cplib._write_file
    saves = []

    def full_on_second_replay_save(filename, content, shown=None):
        if (shown or filename).endswith('replay.json'):
            saves.append(shown)
            if len(saves) == 2:
                raise full(shown)
        return write(filename, content, shown)
    monkeypatch.setattr(cplib, '_write_file', full_on_second_replay_save)
    with pytest.raises(SystemExit) as info:
        main.main(argv('1e9'))
    assert info.value.code == diskfull.EXIT_IO
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and 'Traceback' not in err, err
    assert saves[1] in lines[0]
    first = saving.resume_tag(logdir, report=False)
    assert f'step {first} in' in lines[0]
    monkeypatch.setattr(cplib, '_write_file', write)
    main.main(argv(first + 200))
    assert f'Resumed from the save at step {first}.' in capsys.readouterr().out


@contextlib.contextmanager
def small_tmpfs(folder, size='1m'):
    """A tmpfs of `size` mounted at `folder`; skips when that is not
    possible (mounting needs root)."""
    if os.geteuid() != 0:
        pytest.skip('mounting a small tmpfs needs root')
    folder.mkdir()
    mounted = subprocess.run(
        ['mount', '-t', 'tmpfs', '-o', f'size={size}', 'tmpfs', str(folder)],
        capture_output=True, text=True)
    if mounted.returncode:
        pytest.skip(f'cannot mount a tmpfs: {mounted.stderr.strip()}')
    try:
        yield folder
    finally:
        subprocess.run(['umount', str(folder)], capture_output=True)
        if os.path.ismount(folder):
            subprocess.run(['umount', '-l', str(folder)], capture_output=True)


def run_command(logdir, script, *flags, name, timeout=240):
    run = launch.Launch(
        '--script', script, *FLAGS, *SCRIPT_FLAGS[script], '--logdir',
        logdir, *flags, logfile=logdir.parent.parent / f'{name}.log')
    tree = Tree(run.proc)
    try:
        return finish(run, tree, timeout)
    finally:
        run.kill()


@pytest.mark.slow
@pytest.mark.parametrize('script', list(SCRIPT_FLAGS))
def test_full_tmpfs_ends_with_one_line_and_a_rerun_resumes(tmp_path, script):
    # 2 MiB: the dummy env fills 1 MiB of replay chunks in about 2 s on an
    # idle machine, before the first save after the start (run.save_every
    # 2) could complete, which the checks below need.
    with small_tmpfs(tmp_path / 'disk', size='2m') as disk:
        logdir = disk / 'run'
        code, output = run_command(
            logdir, script, '--run.steps', '1e9', name='full')
        assert code == diskfull.EXIT_IO, output[-3000:]
        assert 'Traceback' not in output, output[-3000:]
        errors = [x for x in output.splitlines() if 'error' in x.lower()]
        assert len(errors) == 1, errors
        match = re.search(
            r'^error: Could not write (\S+) \(no space left on device; '
            r'(\d+) bytes free on that file system\): the last complete '
            r'save, step (\d+) in (\S+), is intact', errors[0])
        assert match, errors[0]
        assert match.group(1).startswith(str(logdir))
        assert match.group(4) == str(logdir / 'ckpt')
        last = int(match.group(3))
        assert last == saving.resume_tag(logdir, report=False)
        assert last > 0
        # Saves newer than the last complete one in some roles only (the
        # write that failed) are never taken for it.
        newer = max(max(cplib.list_tags(logdir / 'ckpt' / r) or [0])
                    for r in saving.ROLES)
        assert newer >= last
        subprocess.run(['mount', '-o', 'remount,size=64m', str(disk)],
                       check=True)
        code, output = run_command(
            logdir, script, '--run.steps', last + 300, name='rerun')
        assert code == 0, output[-3000:]
        resumed = (f'Logger resumed at step {last}.' if script == 'parallel'
                   else f'Resumed from the save at step {last}.')
        assert resumed in output, output[-3000:]
