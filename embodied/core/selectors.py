"""Selectors decide which replay item to sample next.

Every selector is a collection of item keys that the replay keeps in sync with
its items::

    selector[key] = stepids   # a new item; stepids: (length, idbytes) uint8,
                              # None where `selector.uses_stepids` is False
    del selector[key]         # the item was evicted
    key = selector()          # draw a key (IndexError when empty)
    len(selector)             # number of keys

`Prioritized` (and a `Mixture` holding one) also takes
`selector.prioritize(stepids, priorities)` for individual time steps.

Selectors are not thread-safe on their own: the replay serialises all calls
under its lock. `SampleTree` (from `sampletree`, reached here by the
original's name) is the keyed sum tree that `Prioritized` draws from.
"""

import collections

import numpy as np

from .sampletree import SampleTree  # noqa: F401  (the original's name here)


class _Keyed:
    """What the selectors below share: their item keys in `self._keys`."""

    # Whether `selector[key] = stepids` reads the step ids. A replay reads
    # them out of its chunks only for a selector that does (one not derived
    # from here gets them always).
    uses_stepids = False

    def __len__(self):
        return len(self._keys)

    def _require_keys(self):
        if not self._keys:
            raise IndexError(
                f'{type(self).__name__} selector is empty: nothing to sample.')


class Uniform(_Keyed):
    """Every item is equally likely."""

    # Uniform floats drawn ahead in blocks: one numpy call per draw took
    # about as long as the rest of drawing an item.
    _BLOCK = 1024

    def __init__(self, seed=0):
        self._keys = []
        self._indices = {}
        self._rng = np.random.default_rng(seed)
        self._floats = []

    def __call__(self):
        self._require_keys()
        if not self._floats:
            self._floats = self._rng.random(self._BLOCK).tolist()
        # floor(u * n) for u in [0, 1) is an index in [0, n); min() guards
        # against rounding up to n for huge n.
        count = len(self._keys)
        return self._keys[min(int(self._floats.pop() * count), count - 1)]

    def __setitem__(self, key, stepids):
        if key in self._indices:
            raise KeyError(f'Uniform selector already holds key {key!r}.')
        self._indices[key] = len(self._keys)
        self._keys.append(key)

    def __delitem__(self, key):
        # Move the last key into the freed place so removal is O(1).
        index = self._indices.pop(key)
        last = self._keys.pop()
        if index < len(self._keys):
            self._keys[index] = last
            self._indices[last] = index


class Fifo(_Keyed):
    """Always returns the oldest item."""

    def __init__(self):
        self._keys = collections.OrderedDict()

    def __call__(self):
        self._require_keys()
        return next(iter(self._keys))

    def __setitem__(self, key, stepids):
        if key in self._keys:
            raise KeyError(f'Fifo selector already holds key {key!r}.')
        self._keys[key] = None

    def __delitem__(self, key):
        del self._keys[key]


class Recency(_Keyed):
    """Samples by age: the item added `age` items ago has weight `uprobs[age]`.

    `uprobs` holds unnormalised probabilities, newest first (e.g.
    `1 / np.arange(1, capacity + 1)`). While fewer items exist than `uprobs`
    has entries, the weights of the existing ages are renormalised; items older
    than `len(uprobs)` are never drawn. Removing the oldest item is O(1);
    removing any other is O(n).
    """

    def __init__(self, uprobs, seed=0):
        uprobs = np.asarray(uprobs, np.float64)
        if uprobs.ndim != 1 or not len(uprobs):
            raise ValueError(
                f'Recency uprobs must be a non-empty 1-D array, got shape '
                f'{uprobs.shape}.')
        if not np.isfinite(uprobs).all() or (uprobs < 0).any():
            raise ValueError(
                'Recency uprobs must be finite and >= 0, got values in '
                f'[{uprobs.min()}, {uprobs.max()}].')
        if uprobs[0] <= 0:
            raise ValueError(
                'Recency uprobs[0] (the newest item) must be > 0 so that a '
                f'replay holding one item can be sampled, got {uprobs[0]}.')
        self._cumsum = np.cumsum(uprobs)
        self._keys = collections.deque()  # Oldest first.
        self._present = set()
        self._rng = np.random.default_rng(seed)

    def __call__(self):
        self._require_keys()
        ages = min(len(self._keys), len(self._cumsum))
        total = self._cumsum[ages - 1]
        age = int(np.searchsorted(
            self._cumsum[:ages], self._rng.random() * total, 'right'))
        age = min(age, ages - 1)
        return self._keys[-1 - age]

    def __setitem__(self, key, stepids):
        if key in self._present:
            raise KeyError(f'Recency selector already holds key {key!r}.')
        self._present.add(key)
        self._keys.append(key)

    def __delitem__(self, key):
        self._present.remove(key)
        if self._keys[0] == key:
            self._keys.popleft()
        else:
            self._keys.remove(key)


class Prioritized(_Keyed):
    """Samples items in proportion to the priority of their time steps.

    Each time step has a priority (`initial` until `prioritize` sets it); an
    item's weight aggregates its steps' `priority ** exponent` as
    `maxfrac * max + (1 - maxfrac) * mean`. An infinite priority makes the item
    infinitely likely: such items are drawn first, uniformly among them. With
    `zero_on_sample`, drawing an item sets its steps' priorities to zero.
    Items are drawn from a `SampleTree` in O(branching * log n); an update
    recomputes the weights of the items that share the updated steps.
    """

    uses_stepids = True

    def __init__(
            self, exponent=1.0, initial=1.0, zero_on_sample=False,
            maxfrac=0.0, branching=16, seed=0):
        # YAML reads `inf` as a string, so numbers may arrive as text.
        exponent = _number('exponent', exponent)
        initial = _number('initial', initial)
        maxfrac = _number('maxfrac', maxfrac)
        if not 0 <= maxfrac <= 1:
            raise ValueError(
                f'Prioritized maxfrac must be in [0, 1], got {maxfrac!r}.')
        if not exponent >= 0 or not np.isfinite(exponent):
            raise ValueError(
                f'Prioritized exponent must be finite and >= 0, got '
                f'{exponent!r}.')
        if not initial >= 0:
            raise ValueError(
                f'Prioritized initial priority must be >= 0, got {initial!r}.')
        self.exponent = exponent
        self.initial = initial
        self.zero_on_sample = bool(zero_on_sample)
        self.maxfrac = maxfrac
        self.tree = SampleTree(branching, seed)
        self._keys = {}      # key -> array of the item's step indices
        # Time steps get dense indices so priorities live in one array.
        self._step_index = {}  # stepid bytes -> step index
        self._step_keys = []   # step index -> keys of items holding the step
        self._step_ids = []    # step index -> stepid bytes
        self._free_steps = []
        self._prios = np.zeros(64, np.float64)

    def __call__(self):
        self._require_keys()
        key = self.tree.sample()
        if self.zero_on_sample:
            steps = self._keys[key]
            self._prios[steps] = 0.0
            self._refresh(steps)
        return key

    def __setitem__(self, key, stepids):
        if key in self._keys:
            raise KeyError(f'Prioritized selector already holds key {key!r}.')
        steps = np.array([self._add_step(s, key) for s in _as_bytes(stepids)])
        self._keys[key] = steps
        self.tree.insert(key, self._weights(steps[None])[0])

    def __delitem__(self, key):
        self.tree.remove(key)
        for step in self._keys.pop(key).tolist():
            keys = self._step_keys[step]
            keys.remove(key)
            if not keys:
                del self._step_index[self._step_ids[step]]
                self._free_steps.append(step)

    def prioritize(self, stepids, priorities):
        """Sets the priorities of time steps; unknown ones are ignored."""
        stepids = _as_bytes(stepids)
        priorities = np.asarray(priorities, np.float64).reshape(-1)
        if len(stepids) != len(priorities):
            raise ValueError(
                f'prioritize() got {len(stepids)} stepids but '
                f'{len(priorities)} priorities.')
        if np.isnan(priorities).any() or (priorities < 0).any():
            bad = priorities[np.isnan(priorities) | (priorities < 0)]
            raise ValueError(
                f'priorities must be >= 0 and not nan, got {bad[:5].tolist()}.')
        lookup = self._step_index.get
        found = [(i, lookup(s)) for i, s in enumerate(stepids)]
        found = [(i, step) for i, step in found if step is not None]
        if not found:
            return
        rows, steps = np.array(found).T
        self._prios[steps] = priorities[rows]
        self._refresh(steps)

    def _refresh(self, steps):
        """Recomputes the weights of all items that hold one of `steps`."""
        keys = set()
        for step in np.unique(steps).tolist():
            keys.update(self._step_keys[step])
        keys = list(keys)
        groups = collections.defaultdict(list)  # Items of equal length.
        for i, key in enumerate(keys):
            groups[len(self._keys[key])].append(i)
        weights = np.empty(len(keys))
        for group in groups.values():
            matrix = np.stack([self._keys[keys[i]] for i in group])
            weights[group] = self._weights(matrix)
        self.tree.update_many(keys, weights)

    def _weights(self, steps):
        """Weights of items given as rows of step indices."""
        prios = self._prios[steps]
        if self.exponent != 1.0:
            prios = prios ** self.exponent
        largest = prios.max(-1)
        infinite = np.isinf(largest)
        # Mixing max and mean of an infinite row would compute 0 * inf.
        prios = np.where(infinite[:, None], 0.0, prios)
        weights = prios.mean(-1)
        if self.maxfrac:
            weights = (
                self.maxfrac * prios.max(-1) + (1 - self.maxfrac) * weights)
        return np.where(infinite, np.inf, weights)

    def _add_step(self, stepid, key):
        step = self._step_index.get(stepid)
        if step is None:
            if self._free_steps:
                step = self._free_steps.pop()
                self._step_ids[step] = stepid
            else:
                step = len(self._step_keys)
                self._step_keys.append([])
                self._step_ids.append(stepid)
                if step >= len(self._prios):
                    self._prios = np.concatenate(
                        [self._prios, np.zeros(len(self._prios))])
            self._step_index[stepid] = step
            self._prios[step] = self.initial
        self._step_keys[step].append(key)
        return step


class Mixture:
    """Draws from one of several selectors, chosen with the given fractions.

    `selectors` and `fractions` are dicts with the same keys; fractions must be
    >= 0 and sum to 1. Selectors with a zero fraction are dropped and receive
    no items.
    """

    def __init__(self, selectors, fractions, seed=0):
        selectors = dict(selectors)
        fractions = dict(fractions)
        for name, value in fractions.items():
            try:
                fractions[name] = float(value)
            except (TypeError, ValueError):
                raise ValueError(
                    f'Mixture fraction {name!r} must be a number, got '
                    f'{value!r}.') from None
        if set(selectors) != set(fractions):
            raise ValueError(
                f'Mixture needs one fraction per selector: selectors '
                f'{sorted(selectors)}, fractions {sorted(fractions)}.')
        if any(not v >= 0 for v in fractions.values()):
            raise ValueError(
                f'Mixture fractions must be >= 0, got {fractions}.')
        if abs(sum(fractions.values()) - 1) > 1e-6:
            raise ValueError(
                f'Mixture fractions must sum to 1, got {fractions} '
                f'(sum {sum(fractions.values())}).')
        names = sorted(k for k, v in fractions.items() if v > 0)
        self.names = names
        self._selectors = [selectors[k] for k in names]
        self.uses_stepids = any(
            getattr(s, 'uses_stepids', True) for s in self._selectors)
        probs = np.array([fractions[k] for k in names], np.float64)
        self._probs = probs / probs.sum()
        self._rng = np.random.default_rng(seed)

    def __len__(self):
        return len(self._selectors[0])

    def __call__(self):
        index = self._rng.choice(len(self._selectors), p=self._probs)
        return self._selectors[index]()

    def __setitem__(self, key, stepids):
        for selector in self._selectors:
            selector[key] = stepids

    def __delitem__(self, key):
        for selector in self._selectors:
            del selector[key]

    def prioritize(self, stepids, priorities):
        for selector in self._selectors:
            if hasattr(selector, 'prioritize'):
                selector.prioritize(stepids, priorities)


def _number(name, value):
    """`value` as a float; numeric strings such as 'inf' or '1e-3' count."""
    message = (
        f"Prioritized {name} must be a number or a numeric string such as "
        f"'inf', got {value!r}.")
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            raise ValueError(message) from None
    if isinstance(value, (bool, np.bool_)) or not np.isscalar(value):
        raise TypeError(message)
    return float(value)


def _as_bytes(stepids):
    """Stepids as a tuple of bytes, from an (n, idbytes) array or a sequence."""
    if isinstance(stepids, np.ndarray):
        if stepids.ndim != 2:
            raise ValueError(
                f'stepids must have shape (n, idbytes), got {stepids.shape}.')
        stepids = np.ascontiguousarray(stepids)
        return tuple(row.tobytes() for row in stepids)
    return tuple(s if isinstance(s, bytes) else np.asarray(s).tobytes()
                 for s in stepids)
