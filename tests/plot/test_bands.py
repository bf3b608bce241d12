"""Our runs on the published env-step grid, the reproduction table and its
verdicts, and `python -m embodied.plot SWEEP --published SUITE`."""

import re

import numpy as np
import pytest

from embodied import plot
from embodied.perf import learning
from embodied.plot import __main__ as cli
from embodied.plot import bins, compare, published, scores, tasks, verdict
from tests.plot import sweeps


def test_bins_as_the_original_bins():
    grid = bins.Grid(np.array([0.0, 10, 20]))
    assert grid.xs.tolist() == [10, 20]
    # [0, 10) and [10, 20], labelled by their right edges.
    np.testing.assert_array_equal(
        grid.bin([0, 5, 10, 19.9, 20, 25], [1, 2, 3, 4, 5, 100]), [1.5, 4])
    np.testing.assert_array_equal(grid.bin([12], [7]), [np.nan, 7])
    # Episodes: 30 bins to the largest step.
    raw = [scores.Record('t', 'm', 0, [100, 250, 3000], [1, 2, 3])]
    grid = bins.grid(raw)
    assert len(grid.xs) == 30 and grid.xs[0] == 100 and grid.xs[-1] == 3000
    assert not grid.prebinned
    assert len(bins.grid(raw, binsize=1000).xs) == 3


def test_a_binned_published_file_keeps_its_grid_and_values():
    records = [r for r in published.load('dmc_proprio')
               if r.task == 'dmc_walker_walk']
    grid = bins.grid(records)
    assert grid.prebinned
    assert grid.xs.tolist() == list(range(10000, 490001, 10000))
    for record in records:
        np.testing.assert_array_equal(grid.place(record, True), record.ys)
    # A published value at step 0 (as Atari 57's first) has no bin.
    record = scores.Record('t', 'm', 0, [0, 400, 800], [None, 1, 2])
    grid = bins.grid([record])
    assert grid.xs.tolist() == [400, 800]
    np.testing.assert_array_equal(grid.place(record, True), [1, 2])
    # Our episodes on that grid are binned: [0, 400) and [400, 800].
    ours = scores.Record('t', 'ours', 0, [400, 500, 800], [3, 5, 8])
    np.testing.assert_array_equal(grid.place(ours), [np.nan, 16 / 3])


def test_task_names_map_to_the_published_ones():
    assert tasks.published_names('atari100k_pong') == [
        'atari100k_pong', 'atari_pong']
    assert tasks.find('dmc_cup_catch', {'dmc_ball_in_cup_catch'}) == (
        'dmc_ball_in_cup_catch')
    assert tasks.find('dmc_walker_walk', {'dmc_walker_run'}) is None
    assert tasks.run_task('atari_pong', 'atari100k') == 'atari100k_pong'
    assert tasks.run_task('atari_pong', 'atari57') == 'atari_pong'
    assert tasks.run_task('dmc_ball_in_cup_catch', 'dmc_proprio') == (
        'dmc_cup_catch')
    # The learning benchmark reads the same names.
    runs = [{'task': 'atari_pong', 'xs': [1], 'ys': [2]}]
    assert learning.reference_runs(runs, 'atari100k_pong') == runs


def test_marks_and_task_verdicts():
    assert verdict.mark(5, 1, 9) == 'inside'
    assert verdict.mark(1, 1, 9) == 'inside'  # the band's edges are in it
    assert verdict.mark(0.5, 1, 9) == 'below'
    assert verdict.mark(10, 1, 9) == 'above'
    assert verdict.mark(np.nan, 1, 9) == ''
    published_runs = [
        scores.Record('dmc_x', 'dreamerv3', s, [10, 20, 30], ys)
        for s, ys in enumerate([[0, 10, 100], [4, 20, 200]])]
    ours = [scores.Record('dmc_x', 'ours', s, xs, ys) for s, xs, ys in [
        (0, [5, 15, 16], [2, 30, 50]),   # bins 10, 20: 2, 40
        (1, [6, 15], [4, 6])]]           # bins 10, 20: 4, 6
    report = compare.build(ours, published_runs, source='file', reps=50)
    found, = verdict.verdicts(report)
    # Bin 10: mean 3 in [0, 4]; bin 20: mean 23 above [10, 20]; bin 30 has
    # none of ours and ends the rows.
    assert [(r.step, r.mean, r.low, r.high, r.mark) for r in found.rows] == [
        (10, 3, 0, 4, 'inside'), (20, 23, 10, 20, 'above')]
    assert found.rows[1].seeds == [40, 6]
    assert verdict.summary(found) == (
        'inside the band at 1 of 2 steps; at the last, 20: above')
    assert verdict.overall([found]) == (
        '0 of 1 tasks inside the band at their last step; 1 of 2 steps inside.')
    # The intervals are taken at the last bin where ours has a score.
    assert report.at == 1 and report.at_step() == 20


def expected_rows(written, task, published_runs):
    """Each published step up to our last binned episode: (step, our mean,
    each seed's mean, published min, max, mean), worked out here with
    plain loops over the episodes (bins [x - 10000, x))."""
    rows = []
    seeds = sorted(seed for t, seed in written if t == task)
    last = max(max(written[(task, s)][0]) for s in seeds)
    for index, x in enumerate(range(10000, 490001, 10000)):
        if x - 10000 > last:
            break
        means = []
        for seed in seeds:
            xs, ys = written[(task, seed)]
            inside = [y for s, y in zip(xs, ys) if x - 10000 <= s < x]
            means.append(sum(inside) / len(inside) if inside else None)
        values = [r.ys[index] for r in published_runs]
        present = [m for m in means if m is not None]
        rows.append((x, sum(present) / len(present), means, min(values),
                     max(values), sum(values) / len(values)))
    return rows


def table_rows(text, title):
    """The rows of the markdown table under the heading that starts with
    `title`, as lists of cells."""
    section = text[text.index(f'### {title}'):]
    section = section[:section.index('\n\n', section.index('| env step'))]
    lines = [x for x in section.splitlines() if x.startswith('| ')][1:]
    return [[c.strip() for c in line.strip('|').split('|')] for line in lines]


def test_command_draws_a_sweep_over_the_published_band(tmp_path, capsys):
    pytest.importorskip('matplotlib')
    sweep = tmp_path / 'sweep'
    written = sweeps.write_sweep(
        sweep, ['dmc_cartpole_balance', 'dmc_cup_catch'], [0, 1, 2],
        steps=42000)
    code = cli.main([str(sweep), '--published', 'dmc_proprio', '--reps', '500'])
    out = capsys.readouterr().out
    assert code == 0, out
    markdown = (sweep / 'reproduction.md').read_text()
    for name in ('bands.png', 'bands.svg', 'reproduction.md'):
        assert f'Wrote {sweep / name}' in out
    assert (sweep / 'bands.png').stat().st_size > 10000
    svg = (sweep / 'bands.svg').read_text()
    for text in ('dmc_cartpole_balance', '(ours: dmc_cup_catch)', 'Mean',
                 'Median', 'dreamerv3, 3 seeds', 'dreamerv3 (published), 5 seeds'):
        assert f'<!-- {text} -->' in svg, text
    runs = published.load('dmc_proprio')
    for task, name in (('dmc_cartpole_balance', 'dmc_cartpole_balance'),
                       ('dmc_cup_catch', 'dmc_ball_in_cup_catch')):
        published_runs = [r for r in runs if r.task == name]
        expected = expected_rows(written, task, published_runs)
        assert len(expected) == 5  # 10k ... 50k (episodes to 42k)
        title = name if task == name else f'{name} (ours: {task})'
        rows = table_rows(markdown, title)
        assert len(rows) == len(expected)
        for cells, (x, mean, seeds, low, high, pmean) in zip(rows, expected):
            assert cells[0] == str(x)
            assert float(cells[1]) == pytest.approx(mean, abs=0.051)
            assert [float(v) for v in cells[2].split()] == pytest.approx(
                seeds, abs=0.051)
            assert [float(v) for v in cells[3:6]] == pytest.approx(
                [low, high, pmean], abs=0.051)
            assert cells[6] == verdict.mark(mean, low, high)
        inside = sum(verdict.mark(e[1], e[3], e[4]) == 'inside' for e in expected)
        summary = (f'| {name} | dreamerv3 | 3 | {inside}/5 | 50000 | '
                   f'{verdict.mark(*[expected[-1][i] for i in (1, 3, 4)])} |')
        assert summary in markdown
        # The terminal table has the same rows.
        assert re.search(rf'^\s+{expected[0][0]}\s+{float(rows[0][1]):.1f}\s',
                         out, re.M)
    assert 'Aggregates at env step 50000 (tasks: 2):' in out
    for line in ('| Runs | 6 | 10 |', '| IQM (95% CI, score / 1000) |',
                 '| Optimality Gap (95% CI, score / 1000) |'):
        assert line in markdown, line


def test_aggregates_of_published_runs_alone(capsys):
    """A suite that cannot run here still gets its aggregates (DMLab's
    normalized means over its 30 levels)."""
    assert cli.main(['--published', 'dmlab30', '--reps', '200']) == 0
    out = capsys.readouterr().out
    assert 'Aggregates at env step 100000000 (tasks: 30):' in out
    report = plot.compare_runs([], ['dmlab30'], reps=200)
    mean = report.stats['dmlab_mean']['dreamerv3 (published)'][report.at]
    capped = report.stats['dmlab_mean_capped']['dreamerv3 (published)'][report.at]
    # Worked out from the file: each level's seed mean at the last bin,
    # normalized by baselines.yaml's random and human scores.
    table = published.normalization()['dmlab30']
    last = {}
    for record in published.load('dmlab30'):
        if record.xs[-1] == 1e8:
            last.setdefault(record.task, []).append(record.ys[-1])
    values = [(np.mean(v) - table[t][0]) / (table[t][1] - table[t][0])
              for t, v in last.items()]
    assert len(values) == 30
    assert mean == pytest.approx(np.mean(values))
    assert capped == pytest.approx(np.mean(np.minimum(values, 1)))
    assert re.search(rf'DMLab Mean\s+{mean:.3f}', out)
    assert 'Optimality Gap (95% CI, dmlab30)' in out


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    sweeps.write_sweep(tmp_path / 'sweep', ['cartpole_balance'], [0],
                       steps=3000)
    sweeps.write_sweep(tmp_path / 'dmc', ['dmc_walker_walk'], [0], steps=3000)
    (tmp_path / 'loose').mkdir()
    (tmp_path / 'loose' / 'scores.jsonl').write_text(
        '{"step": 1, "episode/score": 1}\n')
    cases = [
        ([], 'Name a LOGDIR, or --published'),
        (['--published', 'crafter'], "No published runs of 'crafter'"),
        ([str(tmp_path / 'sweep'), '--published', 'dmc_proprio'],
         'dmc_proprio-dreamerv3.json.gz has no runs of cartpole_balance'),
        ([str(tmp_path / 'loose'), '--published', 'dmc_proprio'],
         'cannot tell its task and seed'),
        ([str(tmp_path / 'dmc'), '--published', 'dmc_proprio', '--tasks',
          'humanoid'], "--tasks 'humanoid' matches no task"),
        ([str(tmp_path / 'dmc'), '--published', 'dmc_proprio', '--at', '1e7'],
         '--at 1e+07 is past the last bin'),
        ([str(tmp_path / 'dmc'), '--published', 'dmc_proprio', '--stats',
          'bogus'], "Unknown statistic 'bogus'"),
    ]
    for argv, message in cases:
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith('error: ') and message in err, (argv, err)
        assert len(err.strip().splitlines()) == 1, err


def test_runs_are_named_by_their_folder_or_config(tmp_path):
    """A sweep folder's name gives task, method and seed, split on `-` as
    the original's plot.py splits it (a `-` of a task is `%2D`); another
    run's config.yaml gives its task and seed."""
    sweeps.write_sweep(tmp_path / 'sweep', ['dmc_cup_catch', 'gym_CartPole-v1'],
                       [3], method='mine', steps=3000)
    first, second = sorted((tmp_path / 'sweep').iterdir())
    assert first.name == '0-dmc_cup_catch-mine-3'
    _, task, method, seed = first.name.split('-')  # as plot.py does
    assert plot.folders.identify(first) == (task, method, int(seed))
    assert plot.folders.identify(second) == ('gym_CartPole-v1', 'mine', 3)
    run = tmp_path / 'plain'
    run.mkdir()
    (run / 'config.yaml').write_text('task: dmc_walker_walk\nseed: 4\n')
    assert plot.folders.identify(run) == ('dmc_walker_walk', 'ours', 4)
    assert plot.folders.identify(run, 'tuned') == ('dmc_walker_walk', 'tuned', 4)
    assert compare.natural('run10') > compare.natural('run9')
