import collections

import numpy as np
import pytest

from embodied.core import selectors
from embodied.core import sumtree

# Chi-square critical values at p = 0.001, by degrees of freedom.
CHI2_CRITICAL = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 9: 27.88}


def stepids(key, length=2):
    """Distinct (length, 20) uint8 stepids for an item."""
    ids = np.zeros((length, 20), np.uint8)
    ids[:, 0] = key
    ids[:, 1] = np.arange(length)
    return ids


def draw(selector, count):
    return collections.Counter(selector() for _ in range(count))


def assert_matches(counts, probs):
    """Chi-square goodness of fit of observed counts to probabilities."""
    keys = sorted(probs, key=str)
    assert set(counts) <= set(keys), (counts, probs)
    total = sum(counts.values())
    observed = np.array([counts.get(k, 0) for k in keys], np.float64)
    expected = np.array([probs[k] for k in keys], np.float64) * total
    chi2 = ((observed - expected) ** 2 / expected).sum()
    assert chi2 < CHI2_CRITICAL[len(keys) - 1], (chi2, dict(counts), probs)


def test_uniform_is_flat():
    selector = selectors.Uniform(seed=1)
    for key in range(10):
        selector[key] = stepids(key)
    assert_matches(draw(selector, 20000), {k: 0.1 for k in range(10)})


def test_uniform_never_returns_deleted_keys():
    selector = selectors.Uniform(seed=2)
    for key in range(8):
        selector[key] = stepids(key)
    for key in (0, 7, 3):
        del selector[key]
    assert len(selector) == 5
    assert_matches(draw(selector, 10000), {k: 0.2 for k in (1, 2, 4, 5, 6)})


@pytest.mark.parametrize('ctor', [
    selectors.Uniform, selectors.Fifo, lambda: selectors.Recency([1.0]),
    selectors.Prioritized])
def test_empty_selector_says_so(ctor):
    with pytest.raises(IndexError, match='empty'):
        ctor()()


def test_fifo_returns_oldest():
    selector = selectors.Fifo()
    for key in (5, 3, 9):
        selector[key] = stepids(key)
    assert selector() == 5
    del selector[5]
    assert selector() == 3
    del selector[9]
    assert selector() == 3 and len(selector) == 1


@pytest.mark.parametrize(
    'exponent,maxfrac', [(1.0, 0.0), (0.5, 0.0), (2.0, 0.5)])
def test_prioritized_follows_priority_to_the_exponent(exponent, maxfrac):
    selector = selectors.Prioritized(exponent=exponent, maxfrac=maxfrac, seed=3)
    step_prios = {0: [1, 1], 1: [4, 0], 2: [2, 3], 3: [9, 9], 4: [0.5, 6]}
    for key in step_prios:
        selector[key] = stepids(key)
    for key, prios in step_prios.items():
        selector.prioritize(stepids(key), prios)
    weights = {}
    for key, prios in step_prios.items():
        powered = np.asarray(prios, np.float64) ** exponent
        weights[key] = maxfrac * powered.max() + (1 - maxfrac) * powered.mean()
    total = sum(weights.values())
    probs = {k: w / total for k, w in weights.items()}
    assert_matches(draw(selector, 8000), probs)


def test_prioritized_items_share_step_priorities():
    # Overlapping items (as in a replay) share steps: one update moves both.
    selector = selectors.Prioritized(seed=4)
    ids = stepids(0, length=3)
    selector['a'] = ids[:2]
    selector['b'] = ids[1:]
    selector.prioritize(ids, [0.0, 3.0, 1.0])
    # a: mean(0, 3) = 1.5, b: mean(3, 1) = 2.
    assert_matches(draw(selector, 10000), {'a': 1.5 / 3.5, 'b': 2 / 3.5})


def test_prioritized_serves_infinite_priorities_first_then_zeroes_them():
    selector = selectors.Prioritized(
        initial=np.inf, zero_on_sample=True, exponent=0.8, maxfrac=0.5, seed=5)
    for key in range(6):
        selector[key] = stepids(key)
    first = [selector() for _ in range(6)]
    assert sorted(first) == list(range(6))  # Each fresh item once.
    # Now everything is zero: draws fall back to uniform.
    assert_matches(draw(selector, 3000), {k: 1 / 6 for k in range(6)})


def test_prioritized_ignores_unknown_steps_and_survives_deletes():
    selector = selectors.Prioritized(seed=6)
    for key in range(20):
        selector[key] = stepids(key)
    for key in range(0, 20, 2):
        del selector[key]
    selector.prioritize(stepids(0), [100.0, 100.0])  # Deleted item: ignored.
    selector.prioritize(stepids(5), [3.0, 3.0])
    probs = {k: 1.0 for k in range(1, 20, 2)}
    probs[5] = 3.0
    total = sum(probs.values())
    counts = draw(selector, 8000)
    # Bucket the nine equal keys to keep the test's degrees of freedom small.
    grouped = {'five': counts[5], 'rest': sum(counts.values()) - counts[5]}
    assert set(counts) <= set(probs)
    assert_matches(grouped, {'five': 3 / total, 'rest': 9 / total})


def test_prioritized_rejects_bad_priorities():
    selector = selectors.Prioritized()
    selector['a'] = stepids(0)
    with pytest.raises(ValueError, match='priorities'):
        selector.prioritize(stepids(0), [np.nan, 1.0])
    with pytest.raises(ValueError, match='priorities'):
        selector.prioritize(stepids(0), [-1.0, 1.0])
    with pytest.raises(ValueError, match='stepids'):
        selector.prioritize(stepids(0), [1.0])


def test_sumtree_matches_a_plain_array_under_random_changes():
    rng = np.random.default_rng(7)
    tree = sumtree.SumTree(branching=3)
    plain = []
    for i in range(400):
        op = rng.integers(3)
        if op == 0 or not plain:
            plain.append(float(rng.random()))
            assert tree.append(plain[-1]) == len(plain) - 1
        elif op == 1:
            assert tree.pop() == plain.pop()
        else:
            slot = int(rng.integers(len(plain)))
            plain[slot] = float(rng.random() * 10)
            tree.set([slot], [plain[slot]])
        assert len(tree) == len(plain)
        if i % 50 == 0:
            assert [tree.get(j) for j in range(len(plain))] == plain
    assert [tree.get(j) for j in range(len(plain))] == plain
    root = tree._levels[-1][0]
    assert np.isclose(root[0], sum(plain)) and root[2] == len(plain)
    counts = collections.Counter(tree.sample(rng) for _ in range(8000))
    top = sorted(range(len(plain)), key=lambda i: -plain[i])[:5]
    total = sum(plain)
    probs = {i: plain[i] / total for i in top}
    grouped = {i: counts[i] for i in top}
    grouped['rest'] = 8000 - sum(grouped.values())
    probs['rest'] = 1 - sum(probs.values())
    assert_matches(grouped, probs)


def test_recency_follows_uprobs():
    uprobs = np.array([8.0, 4.0, 2.0, 1.0, 1.0, 0.0, 0.0])
    selector = selectors.Recency(uprobs, seed=8)
    for key in range(10):
        selector[key] = stepids(key)
    counts = draw(selector, 16000)
    ages = collections.Counter({9 - key: n for key, n in counts.items()})
    probs = {age: p / uprobs.sum() for age, p in enumerate(uprobs) if p}
    assert_matches(ages, probs)


def test_recency_renormalises_while_filling_and_after_eviction():
    selector = selectors.Recency([3.0, 2.0, 1.0, 1.0], seed=9)
    selector['old'] = stepids(0)
    selector['new'] = stepids(1)
    assert_matches(draw(selector, 5000), {'new': 0.6, 'old': 0.4})
    selector['newest'] = stepids(2)
    del selector['old']
    assert_matches(draw(selector, 5000), {'newest': 0.6, 'new': 0.4})


def test_recency_rejects_bad_uprobs():
    with pytest.raises(ValueError, match='finite'):
        selectors.Recency([1.0, np.nan])
    with pytest.raises(ValueError, match='newest'):
        selectors.Recency([0.0, 1.0])


def test_mixture_respects_fractions():
    # Fifo always picks the oldest key, Recency([1]) the newest.
    mixture = selectors.Mixture(
        {'oldest': selectors.Fifo(), 'newest': selectors.Recency([1.0]),
         'unused': selectors.Uniform()},
        {'oldest': 0.3, 'newest': 0.7, 'unused': 0.0}, seed=10)
    assert mixture.names == ['newest', 'oldest']
    for key in range(5):
        mixture[key] = stepids(key)
    assert len(mixture) == 5
    del mixture[0]
    counts = draw(mixture, 10000)
    assert_matches(counts, {1: 0.3, 4: 0.7})


def test_mixture_forwards_priorities():
    prioritized = selectors.Prioritized(seed=11)
    mixture = selectors.Mixture(
        {'uniform': selectors.Uniform(), 'priority': prioritized},
        {'uniform': 0.5, 'priority': 0.5})
    mixture['a'] = stepids(0)
    mixture['b'] = stepids(1)
    mixture.prioritize(stepids(0), [0.0, 0.0])
    assert all(prioritized() == 'b' for _ in range(50))


@pytest.mark.parametrize('selectors_,fractions,word', [
    ({'a': None}, {'b': 1.0}, 'one fraction per selector'),
    ({'a': None, 'b': None}, {'a': 0.5, 'b': 0.6}, 'sum to 1'),
    ({'a': None, 'b': None}, {'a': 1.5, 'b': -0.5}, '>= 0'),
])
def test_mixture_rejects_bad_fractions(selectors_, fractions, word):
    with pytest.raises(ValueError, match=word):
        selectors.Mixture(selectors_, fractions)


def test_prioritized_accepts_the_strings_yaml_yields():
    # The original's configs.yaml says `initial: inf`, which YAML reads as
    # the string 'inf'; flags can bring other numbers as text.
    import ruamel.yaml as yaml
    prio = yaml.YAML(typ='safe').load(
        '{exponent: 0.8, maxfrac: 0.5, initial: inf, zero_on_sample: True}')
    assert prio['initial'] == 'inf'
    selector = selectors.Prioritized(**prio, seed=3)
    assert selector.initial == np.inf
    assert selectors.Prioritized(exponent='2', maxfrac='1e-1').exponent == 2.0
    assert selectors.Prioritized(maxfrac=' 0.25 ').maxfrac == 0.25
    # Infinite initial priority: each fresh item comes first, once.
    for key in range(4):
        selector[key] = stepids(key)
    assert sorted(selector() for _ in range(4)) == [0, 1, 2, 3]
    selector[9] = stepids(9)
    assert selector() == 9


@pytest.mark.parametrize('kwargs, error, match', [
    (dict(initial='infinity please'), ValueError, "initial .* 'infinity"),
    (dict(initial=''), ValueError, 'initial'),
    (dict(exponent=None), TypeError, 'exponent .* None'),
    (dict(maxfrac=True), TypeError, 'maxfrac'),
    (dict(initial=[1.0]), TypeError, 'initial'),
    (dict(initial='-1'), ValueError, 'initial priority must be >= 0'),
    (dict(initial='nan'), ValueError, 'initial priority must be >= 0'),
    (dict(exponent='inf'), ValueError, 'exponent must be finite'),
    (dict(maxfrac='2'), ValueError, r'maxfrac must be in \[0, 1\]'),
])
def test_prioritized_names_the_bad_argument(kwargs, error, match):
    with pytest.raises(error, match=match):
        selectors.Prioritized(**kwargs)


def test_mixture_names_a_bad_fraction():
    with pytest.raises(ValueError, match="fraction 'b' must be a number"):
        selectors.Mixture(
            dict(a=selectors.Uniform(), b=selectors.Fifo()),
            dict(a=0.5, b='half'))


def test_selectors_resolve_as_in_the_original():
    # The original's main.py builds its selectors as `embodied.replay.selectors`.
    import embodied
    assert embodied.replay.selectors is selectors
    assert embodied.selectors is selectors
    assert embodied.replay.Replay is embodied.Replay
