"""`SampleTree`, the original's keyed sum tree
(`embodied.core.selectors.SampleTree`), and `Prioritized` on it."""

import collections
import math

import numpy as np
import pytest

from embodied.core import selectors
from embodied.core.sampletree import SampleTree
from tests.core.test_selectors import assert_matches, stepids


def draw(tree, count):
    return collections.Counter(tree.sample() for _ in range(count))


def leaf_depths(tree):
    depths, queue = [], [(tree.root, 0)]
    while queue:
        node, depth = queue.pop()
        if hasattr(node, 'children'):
            queue += [(child, depth + 1) for child in node.children]
        else:
            depths.append(depth)
    return depths


def entries(tree):
    """{key: uprob} of the tree's entries, read through `root`."""
    found, queue = {}, [tree.root]
    while queue:
        node = queue.pop()
        if hasattr(node, 'children'):
            queue += node.children
        else:
            found[node.key] = node.uprob
    return found


def test_reached_by_the_originals_name():
    assert selectors.SampleTree is SampleTree
    assert isinstance(selectors.Prioritized(seed=1).tree, SampleTree)


def test_root_and_entries_follow_insert_update_remove():
    tree = SampleTree(branching=3)
    weights = {}
    rng = np.random.default_rng(0)
    for step in range(300):
        op = rng.integers(3)
        if op == 0 or len(weights) < 2:
            key = f'k{step}'
            weights[key] = float(rng.integers(0, 10))
            tree.insert(key, weights[key])
        elif op == 1:
            key = sorted(weights)[rng.integers(len(weights))]
            weights[key] = float(rng.integers(0, 10))
            tree.update(key, weights[key])
        else:
            key = sorted(weights)[rng.integers(len(weights))]
            del weights[key]
            tree.remove(key)
        assert len(tree) == len(weights)
        assert tree.root.uprob == sum(weights.values())
        assert entries(tree) == weights
        assert all(key in tree for key in weights)
        depths = leaf_depths(tree)
        assert len(set(depths)) == 1


@pytest.mark.parametrize('branching', [2, 3, 16])
def test_depth_grows_with_inserts_keeps_through_removes_resets_when_empty(
        branching):
    tree = SampleTree(branching)
    assert leaf_depths(tree) == [] and tree.root.children == []
    for count in range(1, 40):
        tree.insert(count, 1.0)
        depth = max(1, math.ceil(round(math.log(count, branching), 9)))
        assert set(leaf_depths(tree)) == {depth}, count
    for key in range(1, 30):
        tree.remove(key)
    assert set(leaf_depths(tree)) == {depth}
    for key in range(30, 40):
        tree.remove(key)
    assert len(tree) == 0 and tree.root.children == [] and tree.root.uprob == 0
    tree.insert('a', 2.0)
    assert leaf_depths(tree) == [1] and tree.sample() == 'a'


def test_samples_in_proportion_and_never_a_zero_weight():
    tree = SampleTree(branching=2, seed=1)
    weights = {'a': 0.0, 'b': 3.0, 'c': 1.0, 'd': 1e-9, 'e': 6.0}
    for key in weights:
        tree.insert(key, 100.0)
    for key, uprob in weights.items():
        tree.update(key, uprob)
    counts = draw(tree, 10000)
    assert 'a' not in counts
    assert_matches(
        {k: counts[k] for k in 'bce'}, {'b': 0.3, 'c': 0.1, 'e': 0.6})


def test_all_zero_weights_are_equally_likely():
    tree = SampleTree(branching=3, seed=2)
    for key in range(5):
        tree.insert(key, 0.0)
    assert_matches(draw(tree, 5000), {k: 0.2 for k in range(5)})


def test_infinite_weights_come_first_uniformly():
    tree = SampleTree(branching=2, seed=3)
    for key in range(9):
        tree.insert(key, np.inf if key % 3 == 0 else 5.0)
    assert tree.root.uprob == np.inf
    assert_matches(draw(tree, 3000), {0: 1 / 3, 3: 1 / 3, 6: 1 / 3})
    for key in (0, 3, 6):
        tree.update(key, 0.0)
    assert tree.root.uprob == 30.0
    assert set(draw(tree, 500)) == {1, 2, 4, 5, 7, 8}


def test_seed_fixes_the_draws():
    def draws(seed):
        tree = SampleTree(branching=4, seed=seed)
        for key in range(50):
            tree.insert(key, float(key % 7))
        return [tree.sample() for _ in range(100)]
    assert draws(5) == draws(5) and draws(5) != draws(6)


def test_update_many_is_update_for_each():
    one, many = SampleTree(3), SampleTree(3)
    for key in range(20):
        one.insert(key, 1.0)
        many.insert(key, 1.0)
    keys, uprobs = [3, 17, 5], [0.0, np.inf, 7.5]
    for key, uprob in zip(keys, uprobs):
        one.update(key, uprob)
    many.update_many(keys, uprobs)
    assert entries(one) == entries(many)
    assert many.root.uprob == np.inf


def test_bad_use_is_refused_naming_the_key():
    tree = SampleTree()
    with pytest.raises(IndexError, match='empty'):
        tree.sample()
    tree.insert('a', 1.0)
    with pytest.raises(KeyError, match="already holds key 'a'"):
        tree.insert('a', 2.0)
    with pytest.raises(KeyError):
        tree.remove('b')
    with pytest.raises(KeyError):
        tree.update('b', 1.0)
    for bad in (-1.0, np.nan):
        with pytest.raises(ValueError, match="uprob of key 'c'"):
            tree.insert('c', bad)
        with pytest.raises(ValueError, match="uprob of key 'a'"):
            tree.update('a', bad)
        with pytest.raises(ValueError, match="uprob of key 'a'"):
            tree.update_many(['a'], [bad])
    assert len(tree) == 1 and entries(tree) == {'a': 1.0}
    with pytest.raises(ValueError, match='branching'):
        SampleTree(branching=1)


def test_prioritized_keeps_its_tree_at_the_item_weights():
    selector = selectors.Prioritized(maxfrac=0.5, seed=4)
    for key in range(6):
        selector[key] = stepids(key, length=3)
    selector.prioritize(stepids(2, length=3), [1.0, 2.0, 6.0])
    del selector[0]
    del selector[4]
    expected = {k: 1.0 for k in (1, 3, 5)}
    expected[2] = 0.5 * 6.0 + 0.5 * 3.0
    assert entries(selector.tree) == expected
    assert len(selector.tree) == len(selector) == 4
