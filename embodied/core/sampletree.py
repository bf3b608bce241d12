"""Items drawn by key in proportion to their weights: the original's
`SampleTree` (reached as `embodied.core.selectors.SampleTree`).

    tree = SampleTree(branching=16, seed=0)
    tree.insert(key, uprob)     # a new key; KeyError if it is there already
    tree.update(key, uprob)     # KeyError for an unknown key
    tree.remove(key)            # KeyError for an unknown key
    key = tree.sample()         # IndexError when empty
    len(tree), key in tree, tree.root.uprob

`uprob` is an unnormalised probability: a number >= 0, or `inf`. While any
item is infinite, only infinite items are drawn (uniformly among them);
while every weight is zero, every item is equally likely; otherwise an item
with weight zero is never drawn. Insert, update, remove and sample take
O(branching * log n) on an array sum tree (`sumtree.SumTree`). Items fill
its leaves left to right; removing one moves the last item into its place,
so all items sit at one depth, the smallest that holds as many items as the
tree has held since it was last empty.
"""

import numpy as np

from . import sumtree


class SampleTree:

    def __init__(self, branching=16, seed=0):
        self._sums = sumtree.SumTree(branching)
        self.branching = self._sums.branching
        self.rng = np.random.default_rng(seed)
        self._keys = []   # slot -> key
        self._slots = {}  # key -> slot

    def __len__(self):
        return len(self._keys)

    def __contains__(self, key):
        return key in self._slots

    def insert(self, key, uprob):
        """Adds `key` with weight `uprob`."""
        if key in self._slots:
            raise KeyError(f'SampleTree already holds key {key!r}.')
        _check(key, uprob)
        self._slots[key] = self._sums.append(uprob)
        self._keys.append(key)

    def remove(self, key):
        """Removes `key`; the last item moves into its place."""
        slot = self._slots.pop(key)
        last = self._keys.pop()
        weight = self._sums.pop()
        if not self._keys:
            # Start over at depth one, as a tree that never held more items.
            self._sums = sumtree.SumTree(self.branching)
        elif slot < len(self._keys):
            self._keys[slot] = last
            self._slots[last] = slot
            self._sums.set([slot], [weight])

    def update(self, key, uprob):
        """Sets the weight of `key`."""
        slot = self._slots[key]
        _check(key, uprob)
        self._sums.set([slot], [uprob])

    def update_many(self, keys, uprobs):
        """Sets the weights of several keys at once (what `update` does for
        each, in one pass over the tree)."""
        slots = [self._slots[key] for key in keys]
        uprobs = np.asarray(uprobs, np.float64).reshape(-1)
        bad = np.isnan(uprobs) | (uprobs < 0)
        if bad.any():
            index = int(np.argmax(bad))
            _check(keys[index], uprobs[index])
        self._sums.set(slots, uprobs)

    def sample(self):
        """Draws a key (see the module docstring for the probabilities)."""
        if not self._keys:
            raise IndexError('SampleTree is empty: nothing to sample.')
        return self._keys[self._sums.sample(self.rng)]

    @property
    def root(self):
        """The root node: `root.uprob` is the total weight, and each node's
        `children` are its nodes, or at the bottom its entries (`key`,
        `uprob`). Read-only views of the tree as it is now."""
        return _Node(self, self._sums.depth, 0)


class _Node:

    __slots__ = ('_tree', '_level', '_index')

    def __init__(self, tree, level, index):
        self._tree, self._level, self._index = tree, level, index

    def __repr__(self):
        return f'SampleTreeNode(uprob={self.uprob}, children={len(self)})'

    def __len__(self):
        return len(self.children)

    @property
    def uprob(self):
        return self._tree._sums.subtree(self._level, self._index)[0]

    @property
    def children(self):
        tree = self._tree
        first = self._index * tree.branching
        below = range(first, first + tree.branching)
        if self._level == 1:
            return [
                _Entry(tree._keys[slot], tree._sums.get(slot))
                for slot in below if slot < len(tree)]
        return [
            _Node(tree, self._level - 1, index) for index in below
            if tree._sums.subtree(self._level - 1, index)[1]]


class _Entry:

    __slots__ = ('key', 'uprob')

    def __init__(self, key, uprob):
        self.key, self.uprob = key, uprob

    def __repr__(self):
        return f'SampleTreeEntry(key={self.key!r}, uprob={self.uprob})'


def _check(key, uprob):
    if not uprob >= 0:  # Also false for nan.
        raise ValueError(
            f'SampleTree: the uprob of key {key!r} must be >= 0 (or inf), '
            f'got {uprob!r}.')
