"""A numpy agent for tests and benchmarks that checks the data it receives.

`TestAgent` acts randomly and learns nothing. What it does instead is verify,
end to end, that the runner delivers data intact and in order, using the
`count` observation of the dummy env (the number of steps the env instance has
produced):

* `policy` checks that each example's count is the previous one plus 1.
* `train` and `report` check that every sequence in the batch has consecutive
  counts, that every observation and action key is there, and the shapes:
  (batch_size, batch_length + replay_context) for train.

Count 0 with `is_first` is always accepted (the env was restarted), and so is
the first count the policy sees for an example (carry count -1). When the
observations include the dummy env's `image` and `vector`, their content is
checked against `count` too. Order and content checks need `count`; other envs
get the key and shape checks only.

Config keys (the `testing:` block of configs/defaults.yaml), all optional:
`train_burn` (seconds of CPU work per train step), `check_order` (False turns
off every data check), `check_content`, `replay_outs` (train returns
`outs['replay']` with `stepid` and a float32 `testctx` equal to `count`), and
from the global config `seed`, `batch_size`, `batch_length`,
`replay_context`. The agent is thread-safe: the parallel runner's actor and
learner threads call it at the same time.
"""

import re
import threading
import time

import numpy as np

from embodied.core import base
from embodied.envs import dummy

COUNTERS = (
    'policy_calls', 'policy_steps', 'train_batches', 'reports', 'saves',
    'loads')

DEFAULTS = dict(
    train_burn=0.0, check_order=True, check_content=True, replay_outs=False,
    seed=0, batch_size=0, batch_length=0, replay_context=0)

# The burn runs a numpy ufunc over this many float64s per call, a fraction of
# a millisecond, fine enough for burns of a few ms. Ufuncs run on one thread (so the thread CPU clock measures all of the
# burn) and release the GIL while they work, so like an XLA train step the
# burn lets the actor's threads run meanwhile.
BURN_SIZE = 32768


class DataCheckError(ValueError):
    """The data an agent method received was out of order or malformed."""


class TestAgent(base.Agent):
    """Random policy that checks data order; see the module docstring."""

    banner = ['TestAgent: random actions, checks data order and content']
    __test__ = False  # Not a pytest test class, despite the name.

    def __init__(self, obs_space, act_space, config):
        self.config = {key: config.get(key, value)
                       for key, value in DEFAULTS.items()}
        self.obs_space = {
            k: v for k, v in obs_space.items() if not k.startswith('log/')}
        self.act_space = {k: v for k, v in act_space.items() if k != 'reset'}
        self._has_count = 'count' in self.obs_space
        self._content_keys = _dummy_content_keys(self.obs_space)
        if self.config['train_burn'] < 0:
            raise ValueError(
                f"testing.train_burn must be >= 0 seconds, got "
                f"{self.config['train_burn']}.")
        self._lock = threading.Lock()
        self._counters = {name: 0 for name in COUNTERS}
        self._policy_rng = np.random.default_rng(self.config['seed'])
        self._burn_input = np.linspace(0, 1, BURN_SIZE)

    @property
    def counters(self):
        """A snapshot of the call counters."""
        with self._lock:
            return dict(self._counters)

    def init_policy(self, batch_size):
        return {'count': np.full(batch_size, -1, np.int64)}

    def init_train(self, batch_size):
        return {'batches': np.zeros(batch_size, np.int64)}

    def init_report(self, batch_size):
        return {}

    def policy(self, carry, obs, mode='train'):
        is_first = np.asarray(obs['is_first'], bool)
        size = len(is_first)
        last = np.asarray(carry['count'], np.int64)
        if last.size == size:
            last = last.reshape(size)  # Per-example entries of shape (1,).
        if last.shape != (size,):
            raise DataCheckError(
                f"policy: carry['count'] has shape {last.shape}, expected "
                f"({size},) for a batch of {size} observations.")
        count = last
        if self._has_count:
            count = np.asarray(obs['count'], np.int64)
            if self.config['check_order']:
                _check_policy_order(last, count, is_first, obs.get('envid'))
                if self.config['check_content']:
                    self._check_content(obs, 'policy')
        with self._lock:
            act = {
                key: _sample(space, size, self._policy_rng)
                for key, space in self.act_space.items()}
            self._counters['policy_calls'] += 1
            self._counters['policy_steps'] += size
        return {'count': count.copy()}, act, {}

    def train(self, carry, data):
        length = None
        if self.config['batch_length']:
            length = (
                self.config['batch_length'] + self.config['replay_context'])
        self._check_batch(data, 'train', self.config['batch_size'], length)
        burned = self._burn(self.config['train_burn'])
        outs = {}
        if self.config['replay_outs']:
            if 'stepid' not in data:
                raise DataCheckError(
                    "train: testing.replay_outs needs 'stepid' in the batch "
                    f"(keys: {sorted(data)}).")
            outs['replay'] = {
                'stepid': data['stepid'],
                'testctx': _test_context(data)}
        carry = {'batches': np.asarray(carry['batches'], np.int64) + 1}
        with self._lock:
            self._counters['train_batches'] += 1
            metrics = self._metrics()
        metrics['burn_seconds'] = np.float32(burned)
        return carry, outs, metrics

    def report(self, carry, data):
        self._check_batch(data, 'report', self.config['batch_size'], None)
        with self._lock:
            self._counters['reports'] += 1
            metrics = self._metrics()
        return carry, metrics

    def stream(self, st):
        return st

    def save(self):
        with self._lock:
            self._counters['saves'] += 1
            return {'counters': dict(self._counters)}

    def load(self, data, regex=None):
        """Restores saved counters (those matching `regex`); counts a load."""
        saved = data['counters']
        unknown = set(saved) - set(COUNTERS)
        if unknown:
            raise KeyError(
                f'TestAgent.load: unknown counters {sorted(unknown)} in the '
                f'checkpoint (known: {", ".join(COUNTERS)}).')
        with self._lock:
            for name, value in saved.items():
                if regex is None or re.match(regex, name):
                    self._counters[name] = int(value)
            self._counters['loads'] += 1

    def _metrics(self):
        return {
            name: np.int64(value) for name, value in self._counters.items()}

    def _check_batch(self, data, role, batch_size, length):
        if not self.config['check_order']:
            return
        if 'is_first' not in data:
            raise DataCheckError(
                f"{role}: the batch has no 'is_first' (keys: {sorted(data)}).")
        shape = np.shape(data['is_first'])
        wanted = (batch_size, length)  # Zero or None: any size.
        if len(shape) != 2 or any(w and w != s for w, s in zip(wanted, shape)):
            raise DataCheckError(
                f"{role}: data['is_first'] has shape {shape}, expected "
                f"(batch, length) = ({batch_size or 'any'}, "
                f"{length or 'any'}) from the config's batch_size, "
                f"batch_length and replay_context.")
        spaces = {**self.obs_space, **self.act_space}
        for key, space in spaces.items():
            if key not in data:
                raise DataCheckError(
                    f"{role}: the batch lacks '{key}' (keys: {sorted(data)}).")
            actual = np.shape(data[key])
            if actual != shape + space.shape:
                raise DataCheckError(
                    f"{role}: data['{key}'] has shape {actual}, expected "
                    f"{shape + space.shape} (batch, length) + space shape.")
        if self._has_count:
            _check_sequence_order(
                np.asarray(data['count'], np.int64),
                np.asarray(data['is_first'], bool), role)
        if self._has_count and self.config['check_content']:
            self._check_content(data, role)

    def _check_content(self, data, role):
        count = np.asarray(data['count'], np.int64)
        if 'vector' in self._content_keys:
            actual = np.asarray(data['vector'])
            bad = ~np.isclose(actual, dummy.vector_for(count)).all(-1)
            _raise_mismatch(bad, role, 'vector', count)
        if 'image' in self._content_keys:
            # The first row is enough to catch a swapped or corrupted image.
            actual = np.asarray(data['image'])[..., 0, :, :]
            width = actual.shape[-2]
            wanted = dummy.image_for(count, (1, width))[..., 0, :, :]
            bad = (actual != wanted).any((-2, -1))
            _raise_mismatch(bad, role, 'image', count)

    def _burn(self, seconds):
        """Spends `seconds` of this thread's CPU time in numpy, mostly
        without the GIL (see `BURN_SIZE`)."""
        if seconds <= 0:
            return 0.0
        start = time.thread_time()
        output = np.empty_like(self._burn_input)
        while time.thread_time() - start < seconds:
            np.sin(self._burn_input, out=output)
        return time.thread_time() - start


def _check_policy_order(last, count, is_first, envids):
    if count.shape != last.shape:
        raise DataCheckError(
            f"policy: obs['count'] has shape {count.shape}, expected "
            f"{last.shape}.")
    fine = (last < 0) | (count == last + 1) | ((count == 0) & is_first)
    if fine.all():
        return
    index = int(np.flatnonzero(~fine)[0])
    env = '' if envids is None else f' (envid {envids[index]})'
    raise DataCheckError(
        f'policy: example {index}{env} is out of order: expected count '
        f'{last[index] + 1}, got {count[index]} '
        f'(is_first={bool(is_first[index])}).')


def _check_sequence_order(count, is_first, role):
    previous, current = count[:, :-1], count[:, 1:]
    fine = (current == previous + 1) | ((current == 0) & is_first[:, 1:])
    if fine.all():
        return
    row, step = (int(i) for i in np.argwhere(~fine)[0])
    nearby = count[row, max(0, step - 3):step + 5].tolist()
    raise DataCheckError(
        f'{role}: sequence {row} is out of order at step {step + 1}: expected '
        f'count {previous[row, step] + 1}, got {current[row, step]} '
        f'(counts around it: {nearby}).')


def _raise_mismatch(bad, role, key, count):
    if not bad.any():
        return
    where = tuple(int(i) for i in np.argwhere(bad)[0])
    if len(where) == 1:
        place = f'example {where[0]}'
    else:
        place = f'sequence {where[0]} at step {where[1]}'
    raise DataCheckError(
        f"{role}: {place}: '{key}' is not the dummy env's {key} for its count "
        f'{count[where]}.')


def _dummy_content_keys(obs_space):
    """The keys whose content follows the dummy env's functions of count."""
    if 'count' not in obs_space:
        return ()
    keys = []
    vector = obs_space.get('vector')
    if vector is not None and vector.dtype == np.float32 and (
            vector.shape == (dummy.VECTOR_SIZE,)):
        keys.append('vector')
    image = obs_space.get('image')
    if image is not None and image.dtype == np.uint8 and (
            len(image.shape) == 3 and image.shape[-1] == 3):
        keys.append('image')
    return tuple(keys)


def _sample(space, size, rng):
    shape = (size,) + space.shape
    if space.dtype == bool:
        return rng.random(shape) < 0.5
    if space.discrete:
        low = np.broadcast_to(space.low, space.shape).astype(np.int64)
        high = np.broadcast_to(space.high, space.shape).astype(np.int64)
        return rng.integers(low, high, shape).astype(space.dtype)
    low = np.where(np.isfinite(space.low), space.low, -1.0)
    high = np.where(np.isfinite(space.high), space.high, 1.0)
    return rng.uniform(low, high, shape).astype(space.dtype)


def _test_context(data):
    """A float32 (B, T) value per step that replay tests can trace to count."""
    if 'count' in data:
        return np.asarray(data['count']).astype(np.float32)
    return np.zeros(np.shape(data['is_first']), np.float32)
