"""The paper's aggregates, IQM and optimality gap, and the stratified
bootstrap, against values worked out by hand."""

import numpy as np
import pytest

from embodied.plot import aggregates, intervals

nan = np.nan


def curve(name, table):
    table = {k: np.array(v, float) for k, v in table.items()}
    return aggregates.curve(name, table, aggregates.self_ranges(table))


DMC = {  # task: (seeds, bins)
    'dmc_a': [[1, 2], [3, nan]],      # seed means 2, 2
    'dmc_b': [[10, 20], [30, 40]],    # 20, 30
    'dmc_c': [[0, 100]],              # 0, 100
}


def test_mean_median_and_runs_over_tasks_of_seed_means():
    np.testing.assert_allclose(curve('mean', DMC), [22 / 3, 44])
    np.testing.assert_allclose(curve('median', DMC), [2, 30])
    np.testing.assert_array_equal(curve('runs', DMC), [5, 4])


def test_a_task_without_a_score_leaves_the_bin_empty_unless_self_normalized():
    table = {**DMC, 'dmc_d': [[nan, 5]]}
    assert np.isnan(curve('mean', table)[0])
    assert np.isnan(curve('median', table)[0])
    # Self-normalized by each task's own min and max (a: 1-3, b: 10-40, c:
    # 0-100, d: 5-5), NaN-aware: bin 0 is (0.5 + 1/3 + 0) / 3.
    np.testing.assert_allclose(curve('self_mean', table)[0], (0.5 + 1 / 3) / 3)
    np.testing.assert_allclose(curve('self_median', table)[0], 1 / 3)


def test_normalized_by_the_original_tables():
    # atari_pong's gamer range is -20.7 to 14.6; atari_boxing's 0.1 to 12.1.
    atari = {'atari_pong': [[-20.7], [14.6]], 'atari_boxing': [[12.1]]}
    np.testing.assert_allclose(curve('atari_mean', atari), [0.75])
    np.testing.assert_allclose(curve('atari_median', atari), [0.75])
    # DMLab: 2.0 and 0.5 of the random-to-human range; the cap makes 2 -> 1.
    dmlab = {'dmlab_rooms_watermaze': [[4.065 + 2 * (54 - 4.065)]],
             'dmlab_skymaze_irreversible_path_hard': [[50.05]]}
    np.testing.assert_allclose(curve('dmlab_mean', dmlab), [1.25])
    np.testing.assert_allclose(curve('dmlab_mean_capped', dmlab), [0.75])
    procgen = {'procgen_coinrun': [[7.5]], 'procgen_bigfish': [[40]]}
    np.testing.assert_allclose(curve('procgen_mean', procgen), [0.75])
    with pytest.raises(ValueError, match='No normalization of dmc_a, dmc_b, dmc_c in atari57_gamer'):
        curve('atari_mean', DMC)


def test_auto_picks_the_suites_statistics():
    assert aggregates.choose(['runs', 'auto'], ['dmc_a', 'dmc_b']) == [
        'runs', 'mean', 'median']
    assert aggregates.choose(['auto'], ['atari_pong']) == [
        'atari_mean', 'atari_median']
    assert aggregates.choose(['auto'], ['dmlab_x']) == [
        'dmlab_mean', 'dmlab_mean_capped']
    assert aggregates.choose(['auto'], ['procgen_x']) == ['procgen_mean']
    assert aggregates.choose(['auto', 'none'], ['dmc_a', 'atari_pong']) == []
    with pytest.raises(ValueError, match="Unknown statistic 'bogus'"):
        aggregates.choose(['bogus'], ['dmc_a'])


def test_iqm_and_optimality_gap():
    assert intervals.iqm(np.arange(1, 9)) == 4.5  # mean of 3, 4, 5, 6
    assert intervals.iqm([[1, 2, 3], [4, 5, 100]]) == pytest.approx(3.5)
    values = np.random.default_rng(0).normal(size=(7, 13))
    scipy_stats = pytest.importorskip('scipy.stats')
    assert intervals.iqm(values) == pytest.approx(
        scipy_stats.trim_mean(values, 0.25, axis=None))
    np.testing.assert_allclose(
        intervals.iqm(values, axis=1),
        scipy_stats.trim_mean(values, 0.25, axis=1))
    assert intervals.optimality_gap([0.5, 1.5, 0.2]) == pytest.approx(
        1 - (0.5 + 1 + 0.2) / 3)
    assert intervals.optimality_gap([2.0, 3.0], gamma=2) == 0


def test_bootstrap_is_stratified_and_deterministic_with_a_seed(monkeypatch):
    strata = [np.array([0.1, 0.4, 0.9, 0.3]), np.array([0.7, 0.2, 0.5])]
    first = intervals.bootstrap(strata, 'iqm', reps=3000, seed=7)
    assert first == intervals.bootstrap(strata, 'iqm', reps=3000, seed=7)
    assert first != intervals.bootstrap(strata, 'iqm', reps=3000, seed=8)
    point, low, high = first
    assert point == intervals.iqm(np.concatenate(strata))
    assert low < point < high
    # Each task keeps its own runs: with all of one task at 0 and all of the
    # other at 1, every resample's mean is exactly 0.5 (an unstratified
    # resample of the six would vary).
    mean = lambda x, axis: x.mean(axis)
    assert intervals.bootstrap([[0, 0, 0], [1, 1, 1]], mean, reps=500) == (
        0.5, 0.5, 0.5)
    # One task of two runs, 0 and 1: resampled means are 0, 0.5 or 1 with
    # chances 1/4, 1/2, 1/4, so the 95% interval spans 0 to 1.
    assert intervals.bootstrap([[0.0, 1.0]], mean, reps=4000) == (0.5, 0.0, 1.0)
    # Replications drawn in several chunks (here of one replication each)
    # give the same kind of interval, and again the same for the same seed.
    monkeypatch.setattr(intervals, 'CHUNK', 7)
    chunked = intervals.bootstrap(strata, 'iqm', reps=300, seed=7)
    assert chunked == intervals.bootstrap(strata, 'iqm', reps=300, seed=7)
    assert chunked[0] == point and chunked[1] < point < chunked[2]
    with pytest.raises(ValueError, match='No scores'):
        intervals.bootstrap([[]], 'iqm')
