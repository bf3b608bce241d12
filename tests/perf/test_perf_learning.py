"""The learning benchmark's comparison with the original's published scores
(`embodied.perf.learning --reference`), on a small scores file written
here."""

import gzip
import json

import numpy as np
import pytest

from embodied.perf import learning


def write_scores(path, runs):
    with gzip.open(path, 'wt') as f:
        json.dump(runs, f)
    return str(path)


RUNS = [
    {'task': 'dmc_cartpole_balance', 'method': 'dreamerv3', 'seed': 0,
     'xs': [1000, 2000, 3000, 4000], 'ys': [100.0, 200.0, 300.0, 400.0]},
    {'task': 'dmc_cartpole_balance', 'method': 'dreamerv3', 'seed': 1,
     'xs': [1500, 2500, 3500], 'ys': [0.0, 100.0, 500.0]},
    {'task': 'atari_pong', 'method': 'dreamerv3', 'seed': 0,
     'xs': [100], 'ys': [-21.0]},
]


def test_reference_score_is_the_mean_over_seeds_at_the_same_steps():
    runs = learning.reference_runs(RUNS, 'dmc_cartpole_balance')
    assert len(runs) == 2
    # Seed 0: 100, 200 in (0, 2000]; seed 1: 0. Mean of the seed means.
    assert learning.reference_score(runs, 0, 2000) == pytest.approx(75.0)
    # (3000, 3900]: seed 0 has none and falls back to its last (300); seed 1
    # has 500.
    assert learning.reference_score(runs, 3000, 3900) == pytest.approx(400.0)
    assert learning.reference_score(runs, 0, 500) is None


def test_reference_task_names_of_the_original():
    assert learning.reference_runs(RUNS, 'atari100k_pong')[0]['ys'] == [-21.0]
    with pytest.raises(SystemExit, match="no runs of task 'dmc_walker_walk'"):
        learning.reference_runs(RUNS, 'dmc_walker_walk')


def test_summary_prints_the_original_beside_ours(tmp_path, capsys):
    path = write_scores(tmp_path / 'dmc_vision-dreamerv3.json.gz', RUNS)
    # Episodes (seen at wall seconds, env step, score) over 11 minutes.
    episodes = [(t, step, score) for t, step, score in zip(
        np.linspace(60, 660, 8), range(500, 4500, 500), range(8))]
    record = {
        'episodes': episodes, 'wall': 660, 'returncode': 0, 'updates': [],
        'reference': {'path': path, 'task': 'dmc_cartpole_balance'}}
    learning.summarize(record)
    out = capsys.readouterr().out
    assert 'original dmc_cartpole_balance (2 seeds' in out
    rows = [line.split() for line in out.splitlines()
            if line.strip().split(' ')[0] in ('5', '10', '11.0')]
    assert [row[0] for row in rows] == ['5', '10', '11.0']
    # Episodes end every 85.7 s: at 5 minutes our run is at env step 1500,
    # where the original's seeds scored 100 and 0; at 10 minutes at 3500,
    # with 200, 300 (seed 0) and 100, 500 (seed 1) since step 1500.
    assert rows[0][1:4] == ['1500', '1.0', '50.0']
    assert rows[1][1:4] == ['3500', '3.0', '275.0']
    # The end of the run, after the last 5-minute row: seed 0 scored 400,
    # seed 1 none since step 3500 (its last one, 500, counts).
    assert rows[2][1:4] == ['4000', '3.5', '450.0']


def test_a_bad_reference_file_is_named(tmp_path):
    path = tmp_path / 'scores.json.gz'
    path.write_text('not gzip')
    with pytest.raises(SystemExit, match='not a published scores file'):
        learning.load_reference(str(path))


def test_reference_by_suite_reads_the_shipped_runs():
    runs = learning.load_reference('dmc_vision')
    assert len(learning.reference_runs(runs, 'dmc_cup_catch')) == 10
