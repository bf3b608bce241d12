"""Environment wrappers: each changes one thing about an env and declares it.

A wrapper that changes what observations or actions look like also overrides
`obs_space` / `act_space`, so the spaces always describe what passes through.
One that changes actions does it in `inner_action(action)`, which its
`step` applies and `received(env, action)` applies without stepping (for one
env's action or a batch of them): `embodied.load_policy` gives the actions
the run's env receives that way.
"""

import collections
import math
import time

import elements
import numpy as np

from . import base

Wrapper = base.Wrapper  # The original also names it embodied.wrappers.Wrapper.


class TimeLimit(base.Wrapper):
    """Ends episodes after `duration` steps (`is_last` without `is_terminal`).

    With `reset=False` the env is not reset after a cut: it keeps running and
    its next step is only marked `is_first`. Resets the env asks for itself
    (its own `is_last`, or the first step) still reach it. `duration` of 0 or
    None disables the limit.
    """

    def __init__(self, env, duration, reset=True):
        super().__init__(env)
        self._duration = duration
        self._reset = reset
        self._step = 0
        self._cut = False  # The last step was ended by the limit.

    def step(self, action):
        if self._cut and not self._reset:
            self._step, self._cut = 0, False
            obs = dict(self.env.step({**action, 'reset': False}))
            obs['is_first'] = True
            return obs
        if action['reset'] or self._cut:
            self._step, self._cut = 0, False
            return self.env.step({**action, 'reset': True})
        self._step += 1
        obs = dict(self.env.step(action))
        if self._duration and self._step >= self._duration and not (
                obs['is_last']):
            obs['is_last'] = True
            self._cut = True
        return obs


class ActionRepeat(base.Wrapper):
    """Repeats each action `repeat` times and sums the rewards."""

    def __init__(self, env, repeat):
        if int(repeat) != repeat or repeat < 1:
            raise ValueError(
                f'ActionRepeat: repeat must be an integer >= 1, got {repeat}.')
        super().__init__(env)
        self._repeat = int(repeat)

    def step(self, action):
        if action['reset']:
            return self.env.step(action)
        reward = 0.0
        for _ in range(self._repeat):
            obs = self.env.step(action)
            reward += obs['reward']
            if obs['is_last'] or obs['is_terminal']:
                break
        return {**obs, 'reward': np.float32(reward)}


class NormalizeAction(base.Wrapper):
    """Lets the agent act in [-1, 1] on every bounded dimension of `key`.

    Dimensions with an infinite bound are passed through unchanged.
    """

    def __init__(self, env, key='action'):
        super().__init__(env)
        space = _act_space_of(env, key, 'NormalizeAction')
        if space.discrete:
            raise ValueError(
                f"NormalizeAction: act '{key}' is discrete ({space}); "
                f"only continuous actions can be normalized.")
        self._key = key
        self._space = space
        self._mask = np.isfinite(space.low) & np.isfinite(space.high)
        self._low = np.where(self._mask, space.low, -1)
        self._high = np.where(self._mask, space.high, 1)

    @property
    def act_space(self):
        low = np.where(self._mask, -1, self._space.low)
        high = np.where(self._mask, 1, self._space.high)
        space = elements.Space(self._space.dtype, self._space.shape, low, high)
        return {**self.env.act_space, self._key: space}

    def step(self, action):
        return self.env.step(self.inner_action(action))

    def inner_action(self, action):
        """`action` with `key` mapped from [-1, 1] to the env's bounds."""
        value = np.asarray(action[self._key])
        orig = (value + 1) / 2 * (self._high - self._low) + self._low
        orig = np.where(self._mask, orig, value).astype(value.dtype)
        return {**action, self._key: orig}


class ClipAction(base.Wrapper):
    """Clips the action `key` to [low, high], keeping its dtype."""

    def __init__(self, env, key='action', low=-1, high=1):
        super().__init__(env)
        _act_space_of(env, key, 'ClipAction')
        self._key = key
        self._low = low
        self._high = high

    def step(self, action):
        return self.env.step(self.inner_action(action))

    def inner_action(self, action):
        """`action` with `key` clipped to [low, high]."""
        value = np.asarray(action[self._key])
        clipped = np.clip(value, self._low, self._high).astype(value.dtype)
        return {**action, self._key: clipped}


class UnifyDtypes(base.Wrapper):
    """Presents floats as float32 and integers as int32 (uint8 and bool kept).

    Observations are converted on the way out, actions back to the env's own
    dtypes on the way in. Only conversions within a kind happen (float64 to
    float32, int64 to int32, int to float): a value of another kind, such as a
    float image for a uint8 space, passes through unchanged so that
    `CheckSpaces` reports it instead of it being silently cast.
    """

    def __init__(self, env):
        super().__init__(env)
        self._obs_space = {
            k: _unify(v) for k, v in env.obs_space.items()}
        self._act_space = {
            k: _unify(v) for k, v in env.act_space.items()}
        self._act_inner = _numeric_dtypes(env.act_space)
        self._obs_outer = _numeric_dtypes(self._obs_space)

    @property
    def obs_space(self):
        return self._obs_space

    @property
    def act_space(self):
        return self._act_space

    def inner_action(self, action):
        """`action` in the env's own dtypes."""
        return {
            k: _convert(v, self._act_inner[k]) if k in self._act_inner
            else v for k, v in action.items()}

    def step(self, action):
        obs = self.env.step(self.inner_action(action))
        return {
            k: _convert(v, self._obs_outer[k]) if k in self._obs_outer
            else v for k, v in obs.items()}


def _convert(value, dtype):
    array = np.asarray(value)
    if array.dtype == dtype or not np.can_cast(array.dtype, dtype, 'same_kind'):
        return array
    return array.astype(dtype)


def _numeric_dtypes(spaces):
    return {
        k: v.dtype for k, v in spaces.items()
        if np.issubdtype(v.dtype, np.number) or v.dtype == bool}


def _unify(space):
    dtype = space.dtype
    if np.issubdtype(dtype, np.floating):
        target = np.dtype(np.float32)
    elif dtype == np.uint8 or dtype == bool:
        target = dtype
    elif np.issubdtype(dtype, np.integer):
        target = np.dtype(np.int32)
    else:
        return space
    if target == dtype:
        return space
    low, high = space.low, space.high
    if np.issubdtype(target, np.integer):
        info = np.iinfo(target)
        low = np.clip(low, info.min, info.max)
        high = np.clip(high, info.min, info.max)
    return elements.Space(target, space.shape, low, high)


class CheckSpaces(base.Wrapper):
    """Checks each action before and each observation after every step.

    Any mismatch with the declared spaces raises a `SpaceError` (a
    `ValueError`) that names the key, what was wrong, the expected space and
    the actual value, e.g.
    `obs 'image': wrong shape: expected Space(uint8, shape=(64, 64, 3),
    low=0, high=255), got float32 array of shape (64, 64) [min -1.0, max 3.2]`.
    Integer `high` bounds are exclusive, except the dtype's own maximum.
    """

    def __init__(self, env):
        shared = set(env.obs_space) & set(env.act_space)
        if shared:
            raise ValueError(
                f'CheckSpaces: keys {sorted(shared)} are in both the obs '
                f'and the act space.')
        super().__init__(env)
        # Spaces are fixed for an env's lifetime, so the checks are too.
        self._act_checks = _checks(env.act_space)
        self._obs_checks = _checks(env.obs_space)
        # Whether `step` checks the obs; a caller that checks the stacked
        # obs of several envs at once (`check_obs_batch`) turns it off.
        self.check_obs = True

    def step(self, action):
        _check_values('action', action, self._act_checks)
        obs = self.env.step(action)
        if self.check_obs:
            _check_values('obs', obs, self._obs_checks)
        return obs

    def check_stacked(self, obs, batch=None):
        """Checks `batch`, the obs of several envs with this env's spaces
        (`obs`, a list of dicts) stacked per key: one check per key instead
        of one per key and env; without a `batch` (they did not stack), obs
        by obs. A mismatch raises the `SpaceError` that `step` would have
        raised, as a `BatchSpaceError` naming the index of the first obs it
        is in."""
        # Each obs had the batch's keys (it stacked), so equal counts mean
        # equal keys: no obs has an extra one.
        if batch is not None and all(len(o) == len(batch) for o in obs):
            try:
                _check_rows('obs', batch, self._obs_checks)
                return
            except Exception:
                pass  # Found and named below, obs by obs.
        for index, values in enumerate(obs):
            try:
                _check_values('obs', values, self._obs_checks)
            except SpaceError as e:
                raise BatchSpaceError(index, e) from None


class SpaceError(ValueError):
    """A value does not match its space (raised by `CheckSpaces`), as
    opposed to an error of the env itself."""


class BatchSpaceError(SpaceError):
    """The obs at `index` of a batch does not match its space."""

    def __init__(self, index, error):
        super().__init__(str(error))
        self.index = index


def find_check(env):
    """The `CheckSpaces` among the wrappers of `env`, or None."""
    while env is not None:
        if isinstance(env, CheckSpaces):
            return env
        env = getattr(env, 'env', None)
    return None


def shared_check(envs):
    """The `CheckSpaces` of the first of `envs` when every env has one with
    the same obs spaces, each then told to leave its obs unchecked (the
    caller checks them stacked, `check_stacked`); else None."""
    checks = [find_check(env) for env in envs]
    if not all(checks) or not all(
            _same_spaces(check.obs_space, checks[0].obs_space)
            for check in checks):
        return None
    for check in checks:
        check.check_obs = False
    return checks[0]


def _same_spaces(spaces, others):
    # `elements.Space.__eq__` returns a tuple, which is always true.
    return spaces.keys() == others.keys() and all(
        a.dtype == b.dtype and a.shape == b.shape and
        np.array_equal(a.low, b.low) and np.array_equal(a.high, b.high)
        for a, b in zip(spaces.values(), (others[k] for k in spaces)))


def check_values(kind, values, spaces):
    """Raises a SpaceError if `values` (a dict) does not match `spaces`."""
    _check_values(kind, values, _checks(spaces))


def _checks(spaces):
    return {key: _SpaceCheck(space) for key, space in spaces.items()}


def _check_values(kind, values, checks):
    if not isinstance(values, dict):
        raise SpaceError(
            f'{kind}: expected a dict with keys {sorted(checks)}, got '
            f'{type(values).__name__}.')
    for key, check in checks.items():
        if key not in values:
            raise SpaceError(
                f"{kind} '{key}': missing: expected {check.space}, got no "
                f"such key (keys: {sorted(values)}).")
    for key, value in values.items():
        check = checks.get(key)
        if check is None:
            raise SpaceError(
                f"{kind} '{key}': not in the {kind} space: expected one of "
                f"{sorted(checks)}, got {_describe(value)}.")
        problem = check(value)
        if problem:
            raise SpaceError(
                f"{kind} '{key}': {problem}: expected {check.space}, got "
                f"{_describe(value)}.")


def _check_rows(kind, batch, checks):
    """Like `_check_values` for values stacked along a first axis."""
    if batch.keys() != checks.keys():
        raise SpaceError(f'{kind}: keys differ from the space.')
    for key, check in checks.items():
        problem = check.rows(batch[key])
        if problem:
            raise SpaceError(f"{kind} '{key}': {problem}.")


# The reductions without numpy's Python-level wrappers (`array.min()`).
_MIN, _MAX, _SUM = np.minimum.reduce, np.maximum.reduce, np.add.reduce


class _SpaceCheck:
    """A check of values against one space, with the space's bounds reduced
    once to what must really be compared: this runs for every obs and action
    of every env step, so trivial bounds (uint8 images in [0, 255], floats
    in [-inf, inf]) cost nothing and uniform bounds compare against min/max
    instead of building a boolean array per step."""

    def __init__(self, space):
        self.space = space
        self.text = np.issubdtype(space.dtype, np.str_)
        if self.text:
            return
        dtype = space.dtype
        self.floating = np.issubdtype(dtype, np.floating)
        low = np.asarray(space.low)
        high = np.asarray(space.high)
        if np.issubdtype(dtype, np.integer):
            # Integer highs are exclusive, except the dtype's own maximum.
            info = np.iinfo(dtype)
            high = np.where(high < info.max, high - 1, info.max)
            trivial_low, trivial_high = low <= info.min, high >= info.max
        elif dtype == bool:
            trivial_low = trivial_high = np.ones_like(low, bool)
        else:
            trivial_low, trivial_high = low == -np.inf, high == np.inf
        self.low = self._reduce(low, trivial_low)
        self.high = self._reduce(high, trivial_high)
        self.shape, self.dtype = space.shape, space.dtype
        # Any value of the dtype fits (bools, uint8 images, unbounded ints).
        self.unchecked_values = (
            not self.floating and self.low is None and self.high is None)
        # Bounds that are one number (or none) compare against min and max.
        self.uniform_low = np.ndim(self.low) == 0
        self.uniform_high = np.ndim(self.high) == 0
        # Scalars are most keys of a step: they compare as Python numbers.
        self.scalar = space.shape == ()
        if self.scalar:
            self.scalar_low = None if self.low is None else self.low.item()
            self.scalar_high = None if self.high is None else self.high.item()

    @staticmethod
    def _reduce(bound, trivial):
        if trivial.all():
            return None
        if bound.size and (bound == bound.flat[0]).all():
            return bound.flat[0]
        return bound

    def __call__(self, value):
        if self.text:
            if isinstance(value, str) or (
                    isinstance(value, (np.ndarray, np.generic))
                    and np.issubdtype(value.dtype, np.str_)):
                return None
            return 'wrong type'
        if isinstance(value, np.ndarray):
            array = value
        elif isinstance(value, (np.generic, bool, int, float)):
            array = np.asarray(value)
        else:
            return 'wrong type'
        if array.shape != self.shape:
            return 'wrong shape'
        if array.dtype != self.dtype:
            return 'wrong dtype'
        if self.scalar:
            return self._check_scalar(array.item())
        return self._check_array(array)

    def rows(self, array):
        """The problem of any row of `array` (values stacked along a first
        axis), or None."""
        if self.text:
            return None if np.issubdtype(array.dtype, np.str_) else (
                'wrong type')
        if array.shape[1:] != self.shape:
            return 'wrong shape'
        if array.dtype != self.dtype:
            return 'wrong dtype'
        if self.unchecked_values:
            return None
        return self._check_array(array)

    def _check_array(self, array):
        if not array.size:
            return None
        low, high = self.low, self.high
        uniform = self.uniform_low and self.uniform_high
        if self.floating and uniform and (low is not None or high is not None):
            # The extremes tell both finiteness and bounds: NaN and inf
            # show in them. Two reductions instead of three.
            least = _MIN(array, axis=None)
            most = _MAX(array, axis=None)
            if not (math.isfinite(least) and math.isfinite(most)):
                return 'not finite'
            if low is not None and least < low:
                return 'out of bounds'
            if high is not None and most > high:
                return 'out of bounds'
            return None
        if self.floating and not math.isfinite(_SUM(array, axis=None)):
            if not np.isfinite(array).all():
                return 'not finite'
        if low is not None:
            if self.uniform_low:
                if _MIN(array, axis=None) < low:
                    return 'out of bounds'
            elif (array < low).any():
                return 'out of bounds'
        if high is not None:
            if self.uniform_high:
                if _MAX(array, axis=None) > high:
                    return 'out of bounds'
            elif (array > high).any():
                return 'out of bounds'
        return None

    def _check_scalar(self, number):
        if self.floating and not math.isfinite(number):
            return 'not finite'
        if self.scalar_low is not None and number < self.scalar_low:
            return 'out of bounds'
        if self.scalar_high is not None and number > self.scalar_high:
            return 'out of bounds'
        return None


def _describe(value):
    if not isinstance(value, (np.ndarray, np.generic, bool, int, float)):
        return f'{type(value).__name__} {value!r:.80}'
    array = np.asarray(value)
    kind = 'array' if isinstance(value, np.ndarray) else 'scalar'
    text = f'{array.dtype} {kind} of shape {array.shape}'
    if array.size and (
            np.issubdtype(array.dtype, np.number) or array.dtype == bool):
        text += f' [min {array.min()}, max {array.max()}]'
    return text


class DiscretizeAction(base.Wrapper):
    """Turns a continuous action vector into one choice of `bins` per dim.

    Bin `i` of a dimension is the `i`-th of `bins` evenly spaced values from
    its low to its high bound (from -1 to 1 where a bound is infinite).
    """

    def __init__(self, env, key='action', bins=5):
        super().__init__(env)
        space = _act_space_of(env, key, 'DiscretizeAction')
        if space.discrete or len(space.shape) != 1:
            raise ValueError(
                f"DiscretizeAction: act '{key}' must be a continuous vector, "
                f"got {space}.")
        if int(bins) != bins or bins < 2:
            raise ValueError(
                f'DiscretizeAction: bins must be an integer >= 2, got {bins}.')
        finite = np.isfinite(space.low) & np.isfinite(space.high)
        low = np.where(finite, space.low, -1)
        high = np.where(finite, space.high, 1)
        self._key = key
        self._dtype = space.dtype
        self._bins = int(bins)
        # Shape (dims, bins): the continuous value of each bin per dimension.
        self._values = np.linspace(low, high, self._bins, axis=-1)

    @property
    def act_space(self):
        space = elements.Space(
            np.int32, (len(self._values),), 0, self._bins)
        return {**self.env.act_space, self._key: space}

    def step(self, action):
        return self.env.step(self.inner_action(action))

    def inner_action(self, action):
        """`action` with each bin index of `key` turned into its value."""
        choice = np.asarray(action[self._key])
        if choice.shape[-1:] != (len(self._values),) or (
                (choice < 0) | (choice >= self._bins)).any():
            raise ValueError(
                f"DiscretizeAction: act '{self._key}' must hold "
                f"{len(self._values)} bin indices in [0, {self._bins}), got "
                f"{_describe(choice)}.")
        rows = np.arange(len(self._values))
        continuous = self._values[rows, choice.astype(int)]
        return {**action, self._key: continuous.astype(self._dtype)}


class ResizeImage(base.Wrapper):
    """Resizes image observations to `size = (height, width)`.

    Pure numpy: `'nearest'` picks pixels, `'area'` averages the source pixels
    each output pixel covers (best for shrinking). By default every obs of
    rank 2 or 3 with another height and width is resized; `keys` picks them.
    """

    def __init__(self, env, size=(64, 64), keys=None, method='nearest'):
        super().__init__(env)
        if method not in ('nearest', 'area'):
            raise ValueError(
                f"ResizeImage: method must be 'nearest' or 'area', "
                f"got {method!r}.")
        self._size = tuple(int(x) for x in size)
        if len(self._size) != 2 or min(self._size) < 1:
            raise ValueError(
                f'ResizeImage: size must be (height, width), got {size}.')
        spaces = env.obs_space
        if keys is None:
            keys = [
                k for k, v in spaces.items() if len(v.shape) in (2, 3)
                and v.shape[:2] != self._size and not k.startswith('log/')]
        for key in keys:
            if key not in spaces or len(spaces[key].shape) not in (2, 3):
                raise ValueError(
                    f"ResizeImage: obs '{key}' must be an image of shape "
                    f"(height, width[, channels]), got "
                    f"{spaces.get(key, 'no such key')}.")
        self._keys = list(keys)
        self._method = method
        self._weights = {}

    @property
    def obs_space(self):
        spaces = dict(self.env.obs_space)
        for key in self._keys:
            old = spaces[key]
            spaces[key] = elements.Space(
                old.dtype, self._size + old.shape[2:],
                old.low.min(), old.high.max())
        return spaces

    def step(self, action):
        obs = dict(self.env.step(action))
        for key in self._keys:
            obs[key] = self._resize(np.asarray(obs[key]))
        return obs

    def _resize(self, image):
        (h, w), (oh, ow) = image.shape[:2], self._size
        if self._method == 'nearest':
            # Sample at the centre of each output pixel.
            rows = ((np.arange(oh) + 0.5) * h / oh).astype(int)
            cols = ((np.arange(ow) + 0.5) * w / ow).astype(int)
            return image[rows][:, cols]
        rows = self._area_weights(h, oh)
        cols = self._area_weights(w, ow)
        out = np.einsum('ih,hw...,jw->ij...', rows, image.astype(np.float64),
                        cols)
        if np.issubdtype(image.dtype, np.integer):
            info = np.iinfo(image.dtype)
            out = np.clip(np.round(out), info.min, info.max)
        return out.astype(image.dtype)

    def _area_weights(self, size, outsize):
        """Matrix (outsize, size): the share of each input in each output."""
        if (size, outsize) not in self._weights:
            edges = np.arange(outsize + 1) * size / outsize
            starts, ends = edges[:-1, None], edges[1:, None]
            pixels = np.arange(size)[None]
            overlap = np.clip(
                np.minimum(ends, pixels + 1) - np.maximum(starts, pixels),
                0, None)
            self._weights[(size, outsize)] = overlap / overlap.sum(
                1, keepdims=True)
        return self._weights[(size, outsize)]


class BackwardReturn(base.Wrapper):
    """Adds obs `bwreturn`: the rewards of the episode so far, each older
    one discounted by `1 - 1 / horizon` per step."""

    def __init__(self, env, horizon):
        if not horizon >= 1:
            raise ValueError(
                f'BackwardReturn: horizon must be >= 1, got {horizon!r}.')
        super().__init__(env)
        self._discount = 1 - 1 / horizon
        self._return = 0.0

    @property
    def obs_space(self):
        return {**self.env.obs_space, 'bwreturn': elements.Space(np.float32)}

    def step(self, action):
        obs = dict(self.env.step(action))
        if obs['is_first']:
            self._return = 0.0
        self._return = self._return * self._discount + float(obs['reward'])
        obs['bwreturn'] = np.float32(self._return)
        return obs


class AddObs(base.Wrapper):
    """Adds obs `key` with the same `value` at every step, of `space`."""

    def __init__(self, env, key, value, space):
        if key in env.obs_space:
            raise ValueError(f'AddObs: the env already has obs {key!r}.')
        super().__init__(env)
        self._key = key
        self._value = value
        self._space = space

    @property
    def obs_space(self):
        return {**self.env.obs_space, self._key: self._space}

    def step(self, action):
        return {**self.env.step(action), self._key: self._value}


class RestartOnException(base.Wrapper):
    """Recreates the env with `ctor()` when a step raises one of `exceptions`.

    The failed step is retried on the new env as a reset. More than
    `maxfails` failures within `window` seconds re-raise the last exception.
    Waits `wait` seconds before each restart.
    """

    def __init__(
            self, ctor, exceptions=(Exception,), window=300, maxfails=2,
            wait=20):
        if not isinstance(exceptions, (tuple, list)):
            exceptions = (exceptions,)
        self._ctor = ctor
        self._exceptions = tuple(exceptions)
        self._window = window
        self._maxfails = maxfails
        self._wait = wait
        self._fails = collections.deque()
        super().__init__(ctor())

    def step(self, action):
        while True:
            try:
                return self.env.step(action)
            except self._exceptions as e:
                self._failed(e)
            action = {**action, 'reset': np.ones_like(action['reset'])}

    def _failed(self, error):
        now = time.monotonic()
        self._fails.append(now)
        while self._fails and self._fails[0] < now - self._window:
            self._fails.popleft()
        if len(self._fails) > self._maxfails:
            error.add_note(
                f'RestartOnException: the env failed {len(self._fails)} '
                f'times within {self._window} seconds; giving up.')
            raise error
        print(
            f'Restarting env after {type(error).__name__}: {error}',
            flush=True)
        try:
            self.env.close()
        except Exception:
            pass  # The env is already broken; closing it is best effort.
        if self._wait:
            time.sleep(self._wait)
        self.env = self._ctor()


# The wrappers here whose step passes the action's values on unchanged.
PASS_ACTIONS = (
    TimeLimit, ActionRepeat, CheckSpaces, ResizeImage, BackwardReturn,
    AddObs, RestartOnException)


def action_path(env):
    """`(layers, inner)`: the wrappers of this module under which `env`
    changes actions (`inner_action`), outermost first, and the env under
    them. The walk passes the wrappers that leave actions as they are and
    stops at the first env that is none of these (the env itself, or a
    wrapper of your own without an `inner_action`)."""
    layers = []
    while isinstance(env, base.Wrapper):
        if getattr(type(env), 'inner_action', None) is not None:
            layers.append(env)
        elif not isinstance(env, PASS_ACTIONS):
            break
        env = env.env
    return layers, env


def received(env, action):
    """The action that the env under `env`'s wrappers (`action_path`)
    receives when `env.step(action)` is called, as each wrapper's
    `inner_action` changes it on the way in, without stepping. `action` is
    one env's action or a batch (a leading axis, one row per env)."""
    for layer in action_path(env)[0]:
        action = layer.inner_action(action)
    return action


def _act_space_of(env, key, wrapper):
    spaces = env.act_space
    if key not in spaces:
        raise KeyError(
            f"{wrapper}: no act '{key}' in the act space "
            f"(keys: {sorted(spaces)}).")
    return spaces[key]
