"""The original's scores format, read and written, and DreamerV3's published
runs shipped as package data."""

import gzip
import json

import numpy as np
import pytest

from embodied import plot
from embodied.plot import __main__ as cli
from embodied.plot import published, scores
from tests.plot import sweeps


def test_round_trip_keeps_every_run_and_null(tmp_path):
    records = [
        scores.Record('dmc_walker_walk', 'ours', 0, [1001, 2002.5, 3003],
                      [10.25, np.nan, 30.0]),
        scores.Record('atari_pong', 'theirs', 'a', [400], [-21.0]),
    ]
    path = scores.write(tmp_path / 'runs.json.gz', records)
    with gzip.open(path, 'rt') as f:
        raw = json.load(f)
    # The original's layout: a list of records; NaN as null, whole numbers
    # as integers.
    assert raw[0] == {'task': 'dmc_walker_walk', 'method': 'ours', 'seed': 0,
                      'xs': [1001, 2002.5, 3003], 'ys': [10.25, None, 30]}
    again = scores.read(path)
    assert [(r.task, r.method, r.seed) for r in again] == [
        ('dmc_walker_walk', 'ours', 0), ('atari_pong', 'theirs', 'a')]
    for before, after in zip(records, again):
        np.testing.assert_array_equal(before.xs, after.xs)
        np.testing.assert_array_equal(before.ys, after.ys)


def test_published_file_reads_and_writes_back_unchanged(tmp_path):
    records = scores.read(published.path('dmc_proprio'))
    path = scores.write(tmp_path / 'copy.json.gz', records)
    with gzip.open(published.path('dmc_proprio'), 'rt') as f:
        original = json.load(f)
    with gzip.open(path, 'rt') as f:
        copy = json.load(f)
    assert len(copy) == len(original) == 90
    for a, b in zip(original, copy):
        assert {k: a[k] for k in scores.KEYS} == b


def test_bad_files_name_the_file_and_the_problem(tmp_path):
    plain = tmp_path / 'plain.json.gz'
    plain.write_text('not gzip')
    with pytest.raises(ValueError, match='plain.json.gz: not a scores file'):
        scores.read(plain)
    for entries, message in (({'task': 1}, 'expected a list of runs'),
                             ([{'task': 'a', 'xs': [1]}], 'run 0 has no method'),
                             ([{'task': 'a', 'method': 'm', 'seed': 0,
                                'xs': [1, 2], 'ys': [1]}], 'differ in length')):
        path = tmp_path / 'bad.json.gz'
        with gzip.open(path, 'wt') as f:
            json.dump(entries, f)
        with pytest.raises(ValueError, match=message):
            scores.read(path)
    with pytest.raises(FileNotFoundError, match='no such scores file'):
        scores.read(tmp_path / 'missing.json.gz')
    with pytest.raises(ValueError, match=r'named \*\.json\.gz'):
        scores.write(tmp_path / 'runs.json', [])


def test_every_published_suite_ships_with_its_normalization():
    tables = published.normalization()
    expected = {'atari100k': 26, 'atari57': 57, 'dmc_proprio': 18,
                'dmc_vision': 20, 'dmlab30': 30, 'minecraft_diamond': 1,
                'procgen': 16}
    for suite, count in expected.items():
        records = published.load(suite)
        assert {r.method for r in records} == {'dreamerv3'}, suite
        assert len({r.task for r in records}) == count, suite
    # The original's baselines.yaml: 57 Atari games, 30 DMLab levels, 16
    # ProcGen games; two values as it gives them.
    assert {k: len(v) for k, v in tables.items()} == {
        'atari57_gamer': 57, 'dmlab30': 30, 'procgen_hard': 16}
    assert tables['atari57_gamer']['atari_pong'] == (-20.7, 14.6)
    assert tables['procgen_hard']['procgen_coinrun'] == (5.0, 10.0)
    for suite, table in (('atari100k', 'atari57_gamer'),
                         ('atari57', 'atari57_gamer'),
                         ('dmlab30', 'dmlab30'), ('procgen', 'procgen_hard')):
        tasks = {r.task for r in published.load(suite)}
        assert tasks <= set(tables[table]), (suite, tasks - set(tables[table]))
    assert published.path('atari') == published.path('atari57')
    assert published.block('dmlab30') == 'dmlab'
    with pytest.raises(ValueError, match="No published runs of 'crafter'"):
        published.path('crafter')


def test_published_folder_credits_the_source():
    text = (published.FOLDER / 'README.md').read_text()
    assert 'danijar/dreamerv3' in text and 'e3f0224' in text
    assert 'Permission is hereby granted, free of charge' in text
    assert 'Copyright (c) 2024 Danijar Hafner' in text
    shipped = sorted(p.name for p in published.FOLDER.glob('*.json.gz'))
    assert shipped == [f'{s}-dreamerv3.json.gz' for s in published.SUITES]
    for name in shipped:
        assert f'`{name}`' in text, name


def test_command_writes_a_sweep_as_a_scores_file(tmp_path, capsys):
    written = sweeps.write_sweep(tmp_path / 'sweep', ['dmc_walker_walk'],
                                 [0, 1], steps=5000)
    path = tmp_path / 'mine.json.gz'
    assert cli.main([str(tmp_path / 'sweep'), '--write', str(path),
                     '--outdir', str(tmp_path / 'out')]) == 0
    assert f'Wrote {path}' in capsys.readouterr().out
    records = scores.read(path)
    assert [(r.task, r.method, r.seed) for r in records] == [
        ('dmc_walker_walk', 'dreamerv3', 0), ('dmc_walker_walk', 'dreamerv3', 1)]
    for record in records:
        xs, ys = written[(record.task, record.seed)]
        np.testing.assert_array_equal(record.xs, xs)
        np.testing.assert_allclose(record.ys, ys)
    # The file reads back as runs of ours.
    again = plot.folders.read_inputs([path], method='renamed')
    assert {r.method for r in again} == {'renamed'}
