"""embodied.plot: runs read from scores.jsonl, binned, and drawn to PNG/SVG."""

import json
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from embodied import plot
from embodied.plot import __main__ as cli


def write_run(folder, rows):
    folder.mkdir(parents=True)
    with open(folder / 'scores.jsonl', 'w') as f:
        for row in rows:
            f.write(json.dumps(row) + '\n')
    return folder


def linear_run(folder, slope, episodes=40, every=100, seconds=2.0):
    """Episode i ends at step (i + 1) * every, time (i + 1) * seconds, with
    score slope * step."""
    return write_run(folder, [
        {'step': (i + 1) * every, 'time': (i + 1) * seconds,
         'episode/score': slope * (i + 1) * every}
        for i in range(episodes)])


def test_load_skips_other_rows_and_partial_lines(tmp_path):
    folder = write_run(tmp_path / 'run', [
        {'step': 10, 'time': 5.0, 'episode/score': 1.0},
        {'step': 20, 'time': 9.0, 'episode/score': 2.0},
        {'step': 25, 'time': 9.5, 'eval_episode/score': 7.0},
        {'step': 30, 'time': 10.0, 'episode/score': 3.0}])
    with open(folder / 'scores.jsonl', 'a') as f:
        f.write('{"step": 50, "time": 6.0, "episode/sc')  # still being written
    run = plot.load(folder)
    assert run.steps.tolist() == [10, 20, 30]
    assert run.values.tolist() == [1, 2, 3]
    assert run.times.tolist() == [5.0, 9.0, 10.0]
    assert run.label == tmp_path.name  # the parent folder


def test_binned_means_and_spread_over_runs(tmp_path):
    one = write_run(tmp_path / 'a' / '1', [
        {'step': s, 'episode/score': v}
        for s, v in [(10, 1.0), (20, 3.0), (60, 10.0), (100, 4.0)]])
    two = write_run(tmp_path / 'a' / '2', [
        {'step': s, 'episode/score': v} for s, v in [(30, 5.0), (90, 6.0)]])
    runs = [plot.load(one), plot.load(two)]
    assert np.isnan(runs[0].times).all()  # no time column
    ends, table = plot.binned(runs, 'steps', bins=2)
    assert ends.tolist() == [50, 100]
    # Bins (0, 50] and (50, 100]: run 1 has (1 + 3) / 2 and (10 + 4) / 2.
    assert table.tolist() == [[2.0, 7.0], [5.0, 6.0]]
    mean, lo, hi = plot.spread(table, 'std')
    assert mean.tolist() == [3.5, 6.5]
    np.testing.assert_allclose(hi - mean, [1.5, 0.5])
    np.testing.assert_allclose(mean - lo, [1.5, 0.5])
    _, lo, hi = plot.spread(table, 'minmax')
    assert lo.tolist() == [2.0, 6.0] and hi.tolist() == [5.0, 7.0]
    ends, table = plot.binned(runs, 'steps', bins=4)
    # Bins of 25 steps; a bin without episodes of a run is NaN.
    np.testing.assert_equal(table, [[2.0, np.nan, 10.0, 4.0],
                                    [np.nan, 5.0, np.nan, 6.0]])


def test_labels_from_parent_folder_or_regex(tmp_path):
    for method in ('dreamer', 'random'):
        for seed in (0, 1):
            linear_run(tmp_path / method / f'seed{seed}', 1.0)
    folders = plot.find([tmp_path])
    assert len(folders) == 4
    assert [plot.label_for(p) for p in folders] == [
        'dreamer', 'dreamer', 'random', 'random']
    assert [plot.label_for(p, r'(seed\d)') for p in folders] == [
        'seed0', 'seed1', 'seed0', 'seed1']
    with pytest.raises(ValueError, match='does not match'):
        plot.label_for(folders[0], r'nothing(\d)')
    with pytest.raises(FileNotFoundError, match='No scores.jsonl'):
        plot.find([tmp_path / 'dreamer' / 'missing'])


def test_command_writes_png_and_svg(tmp_path, capsys):
    from PIL import Image
    linear_run(tmp_path / 'runs' / 'fast' / 'seed0', 2.0)
    linear_run(tmp_path / 'runs' / 'fast' / 'seed1', 2.5)
    linear_run(tmp_path / 'runs' / 'slow' / 'seed0', 0.5, seconds=30)
    code = cli.main([str(tmp_path / 'runs'), '--outdir', str(tmp_path / 'out'),
                     '--episodes', '--hline', '100'])
    assert code == 0
    png, svg = tmp_path / 'out' / 'curves.png', tmp_path / 'out' / 'curves.svg'
    assert f'Wrote {png}' in capsys.readouterr().out
    assert png.stat().st_size > 0
    with Image.open(png) as image:
        image.load()
        assert image.format == 'PNG'
        width, height = image.size
        assert width > 2 * height  # two panels side by side
        pixels = np.asarray(image.convert('RGB'))
    assert (pixels != 255).any(axis=-1).mean() > 0.01  # something drawn
    root = ET.parse(svg).getroot()
    assert root.tag.endswith('svg')
    text = svg.read_text()
    for words in ('fast (2 runs)', 'slow', 'env steps', 'wall time (min)'):
        assert all(word in text for word in words.split()), words


def test_wall_time_panel_left_out_without_time_column(tmp_path):
    from PIL import Image
    write_run(tmp_path / 'run', [
        {'step': 10 * i, 'episode/score': float(i)} for i in range(1, 20)])
    paths = plot.plot([tmp_path / 'run'])
    assert [p.name for p in paths] == ['curves.png', 'curves.svg']
    with Image.open(paths[0]) as image:
        width, height = image.size
    assert width < 2 * height
    assert '<!-- wall time' not in paths[1].read_text()


def test_bad_input_is_an_error_naming_it(tmp_path, capsys):
    assert cli.main([str(tmp_path / 'nothing')]) == 2
    assert 'No scores.jsonl in' in capsys.readouterr().err
    write_run(tmp_path / 'run', [{'step': 1, 'other': 1.0}])
    assert cli.main([str(tmp_path / 'run')]) == 2
    assert "No 'episode/score' in" in capsys.readouterr().err


def test_missing_matplotlib_names_the_extra(tmp_path, monkeypatch):
    linear_run(tmp_path / 'run', 1.0)
    monkeypatch.setitem(sys.modules, 'matplotlib', None)
    with pytest.raises(ImportError, match=r"pip install 'embodied\[plot\]'"):
        plot.plot([tmp_path / 'run'])
