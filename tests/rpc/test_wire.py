"""`rpc.wire` encodes exactly as portal does, so both sides interoperate."""

import collections

import numpy as np
import portal
import pytest

from embodied.rpc import wire

CASES = {
    'none': None,
    'int': 3,
    'float': 2.5,
    'bool': True,
    'string': 'hello ü',
    'bytes': b'\x00\x01raw',
    'bytearray': bytearray(b'abc'),
    'memoryview': memoryview(b'view'),
    'scalar array': np.float32(1.5),
    'empty array': np.zeros((0, 3), np.float32),
    'batch': {
        'image': np.arange(2 * 4 * 4 * 3, dtype=np.uint8).reshape(2, 4, 4, 3),
        'reward': np.array([0.5, -1.0], np.float32),
        'is_first': np.array([True, False]),
        'envid': np.array([3, 7], np.int32),
    },
    'args list': [['/dev/shm/embodied-slots-x', 3, 'image:|u1:8,12']],
    'nested': {'a': [1, (2.0, 'x'), {'b': None}], 'c': (), 'd': {},
               'e': [np.arange(3)]},
    'tuple top': (np.int64(5), 'y'),
    'ordered dict (fallback)': collections.OrderedDict(a=np.arange(2)),
}


def joined(buffers):
    return b''.join(bytes(memoryview(b).cast('B')) for b in buffers)


def assert_same(a, b):
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    elif isinstance(a, memoryview):
        assert bytes(a) == bytes(b)
    else:
        assert a == b


@pytest.mark.parametrize('name', list(CASES))
def test_same_bytes_as_portal(name):
    data = CASES[name]
    assert joined(wire.pack(data)) == joined(portal.pack(data))


@pytest.mark.parametrize('name', list(CASES))
def test_decodes_what_portal_encodes_as_portal_does(name):
    message = memoryview(joined(portal.pack(CASES[name])))
    assert_same(wire.unpack(message), portal.unpack(message))


def test_round_trip_keeps_arrays_intact():
    batch = CASES['batch']
    got = wire.unpack(memoryview(joined(wire.pack(batch))))
    assert_same(got, batch)


def test_object_arrays_are_refused_like_portal():
    with pytest.raises(TypeError):
        wire.pack({'x': np.array([object()])})


@pytest.mark.parametrize('empty', ['', b''])
def test_empty_strings_are_refused_with_a_clear_error(empty):
    with pytest.raises(ValueError, match='empty string or bytes'):
        wire.pack({'timer/replay': empty})
