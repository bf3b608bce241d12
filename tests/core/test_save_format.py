"""Saves that run no code when read: structure in JSON, arrays in a
safetensors file (`core/savetree.py`, `core/tensorfile.py`), pickles only
where the caller trusts them."""

import json
import os
import pathlib
import pickle
import re

import ml_dtypes
import numpy as np
import pytest

from embodied.core import checkpoint as cplib
from embodied.core import savetree
from embodied.core import tensorfile
from embodied.run import saving


class Value:

    def __init__(self, value=None):
        self.value = value

    def save(self):
        return self.value

    def load(self, data):
        self.value = data


class Marker:
    """A pickle that, when unpickled, creates the file `path`: what a
    hostile save would do instead."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.path),))


def saved(tmp_path, value, tag=5):
    cp = cplib.Checkpoint(tmp_path / 'ckpt')
    cp.agent = Value(value)
    cp.save(tag)
    return cp, tmp_path / 'ckpt' / f'{tag:012d}'


def test_every_kind_of_value_comes_back_as_saved(tmp_path):
    data = {
        'enc/linear0/kernel': np.arange(6, dtype=np.float32).reshape(2, 3),
        'strided': np.arange(8, dtype=np.int16)[::2],
        'bf16': np.ones((2, 2), ml_dtypes.bfloat16),
        'rng/seed': np.int64(7), 'flag': np.bool_(True),
        'empty': np.zeros((0, 3), np.uint8), 'big': np.uint64(2**63 + 1),
        'counters': {'updates': 3, 'ratio': 0.5, 'inf': float('inf')},
        'list': [1, 'two', None, True, [np.float32(3)]],
        'tuple': (1, (2, 3)), 'bytes': b'\x00\xffpad',
        'keys': {1: 'one', (2, 'b'): 'pair', None: 0},
        savetree.TAG: 'a key that looks like a tag',
    }
    cp, folder = saved(tmp_path, data)
    assert sorted(os.listdir(folder)) == [
        'agent.json', 'agent.safetensors', 'done']
    other = cplib.Checkpoint(tmp_path / 'ckpt')
    other.agent = Value()
    other.load(5)
    back = other.agent.value
    assert back.keys() == data.keys()
    for key, value in data.items():
        if isinstance(value, (np.ndarray, np.generic)):
            assert type(back[key]) is type(value), key
            assert back[key].dtype == value.dtype, key
            np.testing.assert_array_equal(back[key], value)
    assert back['counters'] == data['counters']
    assert back['list'][:4] == data['list'][:4]
    assert back['list'][4][0].dtype == np.float32
    assert back['tuple'] == (1, (2, 3)) and back['bytes'] == data['bytes']
    assert back['keys'] == data['keys']
    assert back[savetree.TAG] == data[savetree.TAG]
    # The structure names each array by its path, with dtype and shape.
    meta = json.loads((folder / 'agent.json').read_text())
    node = meta['tree'][savetree.TAG] == 'dict' and dict(
        (k, v) for k, v in meta['tree']['items'])['enc/linear0/kernel']
    assert node == {savetree.TAG: 'array', 'name': 'enc/linear0/kernel',
                    'dtype': 'float32', 'shape': [2, 3]}


def test_entries_without_arrays_are_json_alone(tmp_path):
    _, folder = saved(tmp_path, {'size': 4, 'avail': 1.5})
    assert sorted(os.listdir(folder)) == ['agent.json', 'done']
    assert cplib.read_entry(folder, 'agent') == {'size': 4, 'avail': 1.5}


@pytest.mark.parametrize('value, named', [
    ({'counters': {'seen': {1, 2}}}, "'counters/seen'"),
    ({'fn': print}, "'fn'"),
    ({'obj': [Value()]}, "'obj/0'"),
    ({'text': np.array(['a', 'b'])}, "'text'"),
    ({'objects': np.array([None, 1], object)}, "'objects'"),
    ({'keys': {Value(): 1}}, "'keys'"),
])
def test_save_that_needs_a_pickle_is_refused_naming_the_entry(
        tmp_path, value, named):
    cp = cplib.Checkpoint(tmp_path / 'ckpt')
    cp.agent = Value(value)
    with pytest.raises(savetree.Unsavable) as info:
        cp.save(1)
    line = str(info.value)
    assert '\n' not in line and f"Cannot save 'agent' entry {named}" in line
    assert os.listdir(tmp_path / 'ckpt') == []  # No save, no leftovers.


def test_refusal_is_found_behind_a_remote_error():
    from embodied import rpc
    error = savetree.Unsavable("Cannot save 'agent' entry 'x': it is a set.")
    remote = rpc.RemoteError(f'Actor.save failed: Unsavable: {error}')
    assert str(savetree.find(remote)) == str(error)
    worker = rpc.WorkerFailed('Agent', 2, f'_ThreadFailed: The actor thread '
                              f'failed: Unsavable: {error}')
    assert str(savetree.find(worker)) == str(error)
    assert savetree.find(RuntimeError('Unsavable objects')) is None


def test_array_file_replaced_by_a_pickle_is_refused_without_running_it(
        tmp_path):
    cp, folder = saved(tmp_path, {'kernel': np.ones(64, np.float32)})
    marker = tmp_path / 'ran'
    evil = pickle.dumps({'kernel': Marker(marker)})
    (folder / 'agent.safetensors').write_bytes(evil)
    # A resume tells it apart (its size is not the manifest's) and skips
    # it, reading nothing.
    assert cplib.damage(folder) and cplib.latest_common([cp]) is None
    # Even with the manifest fixed to match, loading reads it as the
    # array file it should be, fails naming it, and runs nothing.
    (folder / 'done').write_text(json.dumps({'files': {
        'agent.json': os.path.getsize(folder / 'agent.json'),
        'agent.safetensors': len(evil)}}))
    with pytest.raises(cplib.DamagedCheckpoint,
                       match=re.escape(str(folder / 'agent.safetensors'))):
        cp.load(5)
    assert not marker.exists()


def test_structure_replaced_by_a_pickle_is_refused_without_running_it(
        tmp_path):
    _, folder = saved(tmp_path, {'kernel': np.ones(4, np.float32)})
    marker = tmp_path / 'ran'
    (folder / 'agent.json').write_bytes(pickle.dumps(Marker(marker)))
    with pytest.raises(cplib.DamagedCheckpoint, match='agent.json'):
        cplib.read(folder, {'agent': lambda data: None})
    assert not marker.exists()


def pickle_save(folder, data):
    """A save as versions before this format wrote it: agent.pkl."""
    folder.mkdir(parents=True)
    content = pickle.dumps(data)
    (folder / 'agent.pkl').write_bytes(content)
    (folder / 'done').write_text(
        json.dumps({'files': {'agent.pkl': len(content)}}))


def test_pickle_save_is_read_only_when_trusted(tmp_path, capsys):
    folder = tmp_path / 'ckpt' / f'{3:012d}'
    marker = tmp_path / 'ran'
    pickle_save(folder, {'step': 3, 'hook': Marker(marker)})
    cp = cplib.Checkpoint(tmp_path / 'ckpt')
    cp.agent = Value()
    with pytest.raises(cplib.PickleSave) as info:
        cp.load(3)
    line = str(info.value)
    assert str(folder / 'agent.pkl') in line and cplib.TRUST_KEY in line
    assert 'pickle' in line and '\n' not in line
    assert not marker.exists() and cp.tags() == [3]  # Nothing moved.
    with pytest.raises(cplib.PickleSave):
        saving.load_agent(Value(), folder)  # run.from_checkpoint alike.
    assert not marker.exists()

    trusted = cplib.Checkpoint(tmp_path / 'ckpt', trust_pickle=True)
    trusted.agent = Value()
    trusted.load(3)
    assert trusted.agent.value['step'] == 3 and marker.exists()
    out = capsys.readouterr().out
    assert f'Read {folder} as a pickle save' in out
    assert 'the next save is in the new format' in out
    trusted.save(4)  # The next save: no pickle.
    assert cplib.pickle_files(tmp_path / 'ckpt' / f'{4:012d}') == []


def test_resume_refuses_pickles_before_it_moves_anything(tmp_path):
    # A resume sets aside saves newer than the resume tag; with a pickle
    # it may not read, it must not get that far.
    logdir = tmp_path / 'run'
    args = saving_args(logdir)
    for role in saving.ROLES:
        pickle_save(logdir / 'ckpt' / role / f'{100:012d}', {'v': 1})
    newer = logdir / 'ckpt' / 'agent' / f'{200:012d}'
    pickle_save(newer, {'v': 2})  # Only one role has it: set aside later.
    cps = [saving.role_checkpoint(args, r, agent=Value())
           for r in saving.ROLES]
    with pytest.raises(cplib.PickleSave):
        saving.resume(logdir, cps)
    assert newer.exists()
    with pytest.raises(cplib.PickleSave):
        saving.refuse_pickles(args)
    trusting = args.update(trust_pickle=True)
    saving.refuse_pickles(trusting)
    cps = [saving.role_checkpoint(trusting, r, agent=Value())
           for r in saving.ROLES]
    assert saving.resume(logdir, cps) == 100
    assert not newer.exists()


def saving_args(logdir):
    import elements
    return elements.Config(logdir=str(logdir), save_keep=3, replicas=1,
                           replica=0, from_checkpoint='', trust_pickle=False)


def test_files_are_safetensors_for_the_safetensors_library(tmp_path):
    numpy_backend = pytest.importorskip('safetensors.numpy')
    arrays = {'a/b': np.arange(12, dtype=np.float32).reshape(3, 4),
              'n': np.int64(5), 'u': np.zeros(3, np.uint8),
              'e': np.zeros((0, 2), np.float16), 'f': np.array([True])}
    ours = tmp_path / 'ours.safetensors'
    tensorfile.save(ours, arrays, {'k': 'v'})
    theirs = numpy_backend.load_file(str(ours))
    for key, value in arrays.items():
        np.testing.assert_array_equal(theirs[key], value)
        assert theirs[key].dtype == np.asarray(value).dtype
    written = tmp_path / 'theirs.safetensors'
    numpy_backend.save_file(
        {k: np.asarray(v) for k, v in arrays.items()}, str(written),
        metadata={'m': '1'})
    back, metadata = tensorfile.read(written)
    assert metadata == {'m': '1'} and tensorfile.problem(written) is None
    for key, value in arrays.items():
        np.testing.assert_array_equal(back[key], value)


def test_files_that_are_not_whole_are_refused(tmp_path):
    path = tmp_path / 'x.safetensors'
    tensorfile.save(path, {'a': np.ones(10, np.float32),
                           'b': np.ones(3, np.int8)})
    content = path.read_bytes()
    path.write_bytes(content[:-5])
    assert 'its header describes' in tensorfile.problem(path)
    with pytest.raises(tensorfile.FormatError, match='do not fit'):
        tensorfile.read(path)
    path.write_bytes(content + b'\x00' * 4)
    with pytest.raises(tensorfile.FormatError, match='after its last array'):
        tensorfile.read(path)
    path.write_bytes(b'\xff' * 8 + content[8:])
    with pytest.raises(tensorfile.FormatError, match='not a safetensors'):
        tensorfile.read(path)
    path.write_bytes(content[:6])
    with pytest.raises(tensorfile.FormatError, match='cut short'):
        tensorfile.read(path)


def test_replicas_read_the_shared_agent_save_in_the_new_format(tmp_path):
    # Replica 0 writes the one agent save that every replica loads;
    # replica 1 reads it (`saving.SharedReader`) and never writes there.
    logdir = tmp_path / 'run'
    args = saving_args(logdir).update(replicas=2)
    weights = {'enc/kernel': np.arange(6, dtype=np.float32)}
    writer = saving.role_checkpoint(args.update(replica=0), 'agent',
                                    agent=Value(weights))
    writer.save(10)
    reader = saving.role_checkpoint(args.update(replica=1), 'agent',
                                    agent=Value())
    assert isinstance(reader, saving.SharedReader)
    assert reader.directory == writer.directory
    reader.load(10)
    np.testing.assert_array_equal(
        reader.agent.value['enc/kernel'], weights['enc/kernel'])
    reader.save(20)  # A reader writes nothing.
    assert reader.tags() == [10]
    pickle_save(reader.directory / f'{30:012d}', weights)
    with pytest.raises(cplib.PickleSave):
        reader.load(30)
    trusting = saving.role_checkpoint(
        args.update(replica=1, trust_pickle=True), 'agent', agent=Value())
    trusting.load(30)
    np.testing.assert_array_equal(
        trusting.agent.value['enc/kernel'], weights['enc/kernel'])
