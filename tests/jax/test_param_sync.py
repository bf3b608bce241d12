"""The policy's parameters from the learner's devices to a policy's devices
through shared memory (`embodied.jax.param_sync`)."""

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from embodied.jax import param_sync
from embodied.rpc import shared_params


class Learner:
    """Device parameters that change with each update."""

    def __init__(self):
        self.lock = threading.Lock()
        self.count = 0
        self.params = self._make(0)

    def _make(self, value):
        return {'w': jnp.full((64, 32), value, jnp.float32),
                'b': jnp.full((32,), value, jnp.float32)}

    def update(self):
        with self.lock:
            self.count += 1
            self.params = self._make(self.count)

    def source(self):
        with self.lock:
            return self.count, dict(self.params)

    def updates(self):
        return self.count


def wait_until(condition, timeout=30):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, 'timed out'
        time.sleep(0.005)


@pytest.mark.parametrize('pinned', [False, True])
def test_each_update_reaches_the_policy_devices(tmp_path, pinned):
    learner = Learner()
    publisher = param_sync.Publisher(
        learner.source, learner.updates, every=1, pinned=pinned,
        directory=tmp_path)
    installed = []
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    subscriber = param_sync.Subscriber(
        publisher.path, publisher.layout, sharding,
        lambda params, version: installed.append((version, params)),
        pinned=pinned)
    try:
        assert subscriber.wait(timeout=10)  # The publisher's first write.
        assert installed[0][0] == 0
        subscriber.start()
        for _ in range(3):
            learner.update()
            wait_until(lambda: installed[-1][0] == learner.count)
        # Each installed copy keeps its version's values while the writer
        # rewrites both slots of the buffer after it.
        for version, params in installed:
            np.testing.assert_array_equal(
                params['w'], np.full((64, 32), version))
        version, params = installed[-1]
        assert isinstance(params['w'], jax.Array)
        assert params['w'].sharding == sharding
        np.testing.assert_array_equal(params['w'], np.full((64, 32), 3))
        publisher.check()
        subscriber.check()
    finally:
        subscriber.close()
        publisher.close()
    assert list(tmp_path.iterdir()) == []


def test_every_n_updates_and_the_lag_the_learner_reads(tmp_path):
    learner = Learner()
    publisher = param_sync.Publisher(
        learner.source, learner.updates, every=3, directory=tmp_path)
    installed = []
    subscriber = param_sync.Subscriber(
        publisher.path, publisher.layout,
        jax.sharding.SingleDeviceSharding(jax.devices()[0]),
        lambda params, version: installed.append(version))
    try:
        subscriber.wait(timeout=10)
        learner.update()
        learner.update()
        # Two updates: no write yet; the update count reaches the reader.
        wait_until(lambda: subscriber.reader.updates == 2)
        assert not subscriber.update()
        assert subscriber.lag() == 2
        learner.update()
        wait_until(subscriber.update)
        assert installed == [0, 3]
        assert subscriber.lag() == 0
        assert publisher.lags() == {
            'policy_lag/mean': 1.0, 'policy_lag/max': 2}
    finally:
        subscriber.close()
        publisher.close()


def test_a_layout_change_is_refused_by_the_reader(tmp_path):
    learner = Learner()
    publisher = param_sync.Publisher(
        learner.source, learner.updates, directory=tmp_path)
    try:
        layout = tuple((k, d, (1,)) for k, d, _ in publisher.layout)
        with pytest.raises(ValueError, match='another layout'):
            param_sync.Subscriber(publisher.path, layout, None, print)
    finally:
        publisher.close()
    assert shared_params.PREFIX not in ' '.join(
        p.name for p in tmp_path.iterdir())


def test_a_read_the_writer_outran_is_tried_again_later(tmp_path):
    learner = Learner()
    publisher = param_sync.Publisher(
        learner.source, learner.updates, every=1, directory=tmp_path)
    installed = []
    subscriber = param_sync.Subscriber(
        publisher.path, publisher.layout,
        jax.sharding.SingleDeviceSharding(jax.devices()[0]),
        lambda params, version: installed.append(version))
    read = subscriber.reader.read

    def outrun(consume=None):
        raise shared_params.TornRead('rewritten')
    try:
        subscriber.reader.read = outrun
        assert not subscriber.update()
        assert subscriber.torn == 1 and not installed
        subscriber.check()  # No error: the policy acts on.
        subscriber.reader.read = read
        assert subscriber.update() and installed == [0]
    finally:
        subscriber.close()
        publisher.close()
