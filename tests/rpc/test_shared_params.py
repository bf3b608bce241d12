"""The learner -> policy parameter buffer in shared memory
(`rpc.shared_params`): generations, double buffering, torn reads, lag and
cleanup of its file."""

import os
import pathlib
import signal
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from embodied.rpc import shared_params

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAYOUT = (('a', '<f4', (3, 4)), ('b', '<i4', (5,)))


def arrays(value):
    return {'a': np.full((3, 4), value, np.float32),
            'b': np.full((5,), value, np.int32)}


def ours(directory):
    return sorted(p.name for p in pathlib.Path(directory).iterdir()
                  if p.name.startswith(shared_params.PREFIX))


@pytest.fixture
def shm(tmp_path):
    directory = tmp_path / 'shm'
    directory.mkdir()
    yield directory
    assert ours(directory) == []  # Nothing left behind.


def test_the_reader_gets_the_newest_generation_once(shm):
    writer = shared_params.ParamWriter(LAYOUT, shm)
    reader = shared_params.ParamReader(writer.path, LAYOUT)
    try:
        assert reader.read() is None  # Nothing published yet.
        writer.write(arrays(1), version=10)
        writer.write(arrays(2), version=20)
        generation, version, value = reader.read()
        assert (generation, version) == (2, 20)
        np.testing.assert_array_equal(value['a'], np.full((3, 4), 2))
        np.testing.assert_array_equal(value['b'], np.full(5, 2))
        assert reader.read() is None  # Nothing newer.
        writer.write(arrays(3), version=30)
        assert reader.read()[:2] == (3, 30)
        writer.set_updates(33)
        assert reader.updates == 33
    finally:
        reader.close()
        writer.close()


def test_one_write_during_a_read_leaves_the_slot_read_intact(shm):
    """Double buffering: the writer fills the other slot."""
    writer = shared_params.ParamWriter(LAYOUT, shm)
    reader = shared_params.ParamReader(writer.path, LAYOUT)
    try:
        writer.write(arrays(1), version=1)

        def consume(views):
            first = np.array(views['a'])
            writer.write(arrays(2), version=2)  # Meanwhile, once.
            return first, np.array(views['b'])

        generation, version, (a, b) = reader.read(consume)
        assert (generation, version) == (1, 1)
        assert (a == 1).all() and (b == 1).all()
        assert reader.read()[:2] == (2, 2)
    finally:
        reader.close()
        writer.close()


def test_a_torn_read_is_retried_on_the_newer_generation(shm):
    writer = shared_params.ParamWriter(LAYOUT, shm)
    reader = shared_params.ParamReader(writer.path, LAYOUT)
    try:
        writer.write(arrays(1), version=1)
        calls = []

        def consume(views):
            first = np.array(views['a'])
            if not calls:  # Twice during the first read: its slot again.
                writer.write(arrays(2), version=2)
                writer.write(arrays(3), version=3)
            calls.append(1)
            return first, np.array(views['b'])

        generation, version, (a, b) = reader.read(consume)
        assert len(calls) == 2  # The first read was torn and dropped.
        assert (generation, version) == (3, 3)
        assert (a == 3).all() and (b == 3).all()

        def always_torn(views):
            writer.write(arrays(0), version=0)
            writer.write(arrays(0), version=0)
        reader.tries = 2
        writer.write(arrays(4), version=4)
        with pytest.raises(shared_params.TornRead, match='2 reads in a row'):
            reader.read(always_torn)
    finally:
        reader.close()
        writer.close()


WRITER = r'''
import sys, numpy as np
from embodied.rpc import shared_params
layout = (('a', '<f4', (256, 1024)),)
writer = shared_params.ParamWriter(layout, sys.argv[1])
print(writer.path, flush=True)
version = 0
while sys.stdin.readline().strip() != 'stop':
    for _ in range(50):
        version += 1
        writer.write({'a': np.full((256, 1024), version, np.float32)}, version)
    print(version, flush=True)
writer.close()
'''


def test_reads_beside_a_writing_process_are_never_mixed(shm):
    """Reads while another process writes 1 MiB generations back to back:
    every read holds one generation's values only, and its version."""
    writer = subprocess.Popen(
        [sys.executable, '-c', WRITER, str(shm)], cwd=ROOT, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        env={**os.environ, 'PYTHONPATH': str(ROOT)})
    try:
        path = writer.stdout.readline().strip()
        reader = shared_params.ParamReader(
            path, (('a', '<f4', (256, 1024)),), tries=1000)
        reads = set()

        def read():
            got = reader.read()
            if got is not None:
                _, version, value = got
                assert np.unique(value['a']).tolist() == [version]
                reads.add(version)
            return got

        for _ in range(20):
            writer.stdin.write('go\n')
            writer.stdin.flush()
            while read() is not None or not writer.stdout.readline():
                pass
            read()  # The round's last generation, whole once the line came.
        assert len(reads) >= 20
        reader.close()
        writer.stdin.write('stop\n')
        writer.stdin.flush()
        assert writer.wait(30) == 0
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()


READER = r'''
import sys, time
from embodied.rpc import shared_params
reader = shared_params.ParamReader(sys.argv[1], eval(sys.argv[2]))
print('attached', flush=True)
time.sleep(600)
'''


def test_the_file_goes_once_the_reader_attached_and_a_killed_reader_leaves_nothing(shm):
    writer = shared_params.ParamWriter(LAYOUT, shm)
    reader = subprocess.Popen(
        [sys.executable, '-c', READER, writer.path, repr(LAYOUT)], cwd=ROOT,
        text=True, stdout=subprocess.PIPE,
        env={**os.environ, 'PYTHONPATH': str(ROOT)})
    try:
        assert reader.stdout.readline().strip() == 'attached'
        assert writer.attached == reader.pid
        assert ours(shm)  # Until the writer's next write or count.
        writer.write(arrays(1), version=1)
        assert ours(shm) == []
        reader.send_signal(signal.SIGKILL)
        reader.wait()
        writer.write(arrays(2), version=2)  # The writer goes on.
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait()
        writer.close()


def test_close_removes_the_file_and_a_killed_writers_file_is_removed(shm):
    writer = shared_params.ParamWriter(LAYOUT, shm)
    assert len(ours(shm)) == 1
    writer.close()
    # A writer killed before any reader attached leaves its file; the next
    # writer on the machine deletes it (its pid is gone).
    killed = subprocess.run(
        [sys.executable, '-c', (
            'import os, sys\nfrom embodied.rpc import shared_params\n'
            f'w = shared_params.ParamWriter({LAYOUT!r}, sys.argv[1])\n'
            'os.kill(os.getpid(), 9)\n'), str(shm)],
        cwd=ROOT, env={**os.environ, 'PYTHONPATH': str(ROOT)})
    assert killed.returncode == -signal.SIGKILL
    assert len(ours(shm)) == 1
    writer = shared_params.ParamWriter(LAYOUT, shm)
    assert ours(shm) == [pathlib.Path(writer.path).name]
    writer.close()


def test_a_reader_of_another_layout_is_refused(shm):
    writer = shared_params.ParamWriter(LAYOUT, shm)
    try:
        with pytest.raises(ValueError, match='another layout'):
            shared_params.ParamReader(
                writer.path, (('a', '<f4', (3, 4)), ('b', '<i4', (6,))))
        other = (('a', '<f4', (4, 3)), ('b', '<i4', (5,)))  # Same bytes.
        with pytest.raises(ValueError, match='another layout'):
            shared_params.ParamReader(writer.path, other)
    finally:
        writer.close()


def test_lag_flows_back_per_window(shm):
    writer = shared_params.ParamWriter(LAYOUT, shm)
    reader = shared_params.ParamReader(writer.path, LAYOUT)
    try:
        assert writer.lags() == {}
        for lag in (0, 2, 1):
            reader.add_lag(lag)
        assert writer.lags() == {'policy_lag/mean': 1.0, 'policy_lag/max': 2}
        assert writer.lags() == {}
        reader.add_lag(1)
        assert writer.lags() == {'policy_lag/mean': 1.0, 'policy_lag/max': 1}
    finally:
        reader.close()
        writer.close()


def test_without_dev_shm_the_file_lies_in_the_temporary_folder(
        monkeypatch, tmp_path):
    monkeypatch.setattr(shared_params, 'SHM_DIR', str(tmp_path / 'none'))
    monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path))
    writer = shared_params.ParamWriter(LAYOUT)
    assert os.path.dirname(writer.path) == str(tmp_path)
    writer.close()
    assert ours(tmp_path) == []
