"""A sum tree over numbered slots for sampling in proportion to weights.

`SumTree` stores a non-negative weight per slot `0 .. len-1` and draws a slot
with probability proportional to its weight in O(branching * log n). Weights
may be `inf`: while any slot is infinite, only infinite slots are drawn
(uniformly among them); while all weights are zero, every slot is equally
likely. Each node holds three sums over its subtree (the finite weight, the
number of infinite slots and the number of used slots), recomputed from its
children on every change, so no rounding error accumulates.
"""

import numpy as np

_FINITE, _INFINITE, _USED = 0, 1, 2


class SumTree:

    def __init__(self, branching=16):
        if int(branching) != branching or branching < 2:
            raise ValueError(
                f'branching must be an integer >= 2, got {branching!r}.')
        self.branching = int(branching)
        self._size = 0
        self._levels = self._build(np.zeros((self.branching, 3)))

    def __len__(self):
        return self._size

    def append(self, weight):
        """Adds a slot at the end and returns its number."""
        if self._size == len(self._levels[0]):
            leaves = np.zeros((len(self._levels[0]) * self.branching, 3))
            leaves[:self._size] = self._levels[0][:self._size]
            self._levels = self._build(leaves)
        slot = self._size
        self._size += 1
        self.set([slot], [weight])
        return slot

    def pop(self):
        """Removes the last slot and returns its weight."""
        if not self._size:
            raise IndexError('pop from an empty SumTree')
        slot = self._size - 1
        weight = self.get(slot)
        self._write(np.array([slot]), np.zeros((1, 3)))
        self._size -= 1
        return weight

    def get(self, slot):
        finite, infinite, _ = self._levels[0][slot]
        return np.inf if infinite else float(finite)

    @property
    def depth(self):
        """Levels below the root: the slots are the root's descendants at
        this depth (at least 1; it grows by one whenever the slots fill
        `branching ** depth` and never shrinks)."""
        return len(self._levels) - 1

    def subtree(self, level, index):
        """`(weight, slots)` of node `index` on `level` (0: the slots
        themselves, `depth`: the root): the sum of the weights under it
        (`inf` if one is) and how many slots are in use under it."""
        finite, infinite, used = self._levels[level][index]
        return (np.inf if infinite else float(finite)), int(used)

    def set(self, slots, weights):
        """Sets the weights of existing slots (sequences of equal length)."""
        slots = np.asarray(slots, np.int64).reshape(-1)
        weights = np.asarray(weights, np.float64).reshape(-1)
        if len(slots) != len(weights):
            raise ValueError(
                f'set() got {len(slots)} slots but {len(weights)} weights')
        if len(slots) and (slots.min() < 0 or slots.max() >= self._size):
            raise IndexError(
                f'slot out of range 0..{self._size - 1}: {slots.tolist()}')
        if np.isnan(weights).any() or (weights < 0).any():
            raise ValueError(
                f'weights must be >= 0 and not nan, got {weights.tolist()}')
        rows = np.zeros((len(slots), 3))
        infinite = np.isinf(weights)
        rows[:, _FINITE] = np.where(infinite, 0.0, weights)
        rows[:, _INFINITE] = infinite
        rows[:, _USED] = 1
        self._write(slots, rows)

    def sample(self, rng):
        """Draws a slot number; raises IndexError when the tree is empty."""
        if not self._size:
            raise IndexError('cannot sample from an empty SumTree')
        node = 0
        # A node's row holds its children's sums, so it tells which of
        # their columns to draw by without a reduction over them.
        finite, infinite, _ = self._levels[-1][0]
        for level in reversed(self._levels[:-1]):
            children = level[node * self.branching:(node + 1) * self.branching]
            if infinite:
                weights = children[:, _INFINITE]
            elif finite > 0:
                weights = children[:, _FINITE]
            else:
                weights = children[:, _USED]
            cumsum = np.cumsum(weights)
            threshold = rng.random() * cumsum[-1]
            index = int(np.searchsorted(cumsum, threshold, 'right'))
            # Guard against rounding at the upper end and against zero-weight
            # children (searchsorted never lands on those otherwise).
            index = min(index, len(weights) - 1)
            while weights[index] <= 0:
                index -= 1
            finite, infinite, _ = children[index]
            node = node * self.branching + index
        return node

    def _write(self, slots, rows):
        self._levels[0][slots] = rows
        b = self.branching
        pairs = list(zip(self._levels[:-1], self._levels[1:]))
        if len(slots) <= 4:  # Plain indices are cheaper than np.unique here.
            for node in set(slots.tolist()):
                for lower, upper in pairs:
                    node //= b
                    upper[node] = lower[node * b:(node + 1) * b].sum(0)
            return
        parents = slots
        for lower, upper in pairs:
            parents = np.unique(parents // b)
            upper[parents] = lower.reshape(-1, b, 3)[parents].sum(1)

    def _build(self, leaves):
        levels = [leaves]
        while len(levels[-1]) > 1:
            levels.append(levels[-1].reshape(-1, self.branching, 3).sum(1))
        return levels
