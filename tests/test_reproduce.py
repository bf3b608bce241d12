"""`python -m embodied.reproduce`: the plan it states, the refusals before
anything starts, docs/reproducing.md's commands, and one tiny launch of the
`dmc_proprio` block at the `debug` size on the CPU (the table's format and
verdicts, not the learning), rerun to see it skip the finished runs."""

import json
import re
import shlex

import numpy as np
import pytest

import launch
from embodied import reproduce
from embodied.plot import published
from tests import test_user_paths

PAGE = launch.ROOT / 'docs' / 'reproducing.md'


def run(*flags, timeout=900):
    result = launch.run(*flags, module='embodied.reproduce', timeout=timeout)
    return result.returncode, result.stdout


def test_dry_run_says_what_it_would_run(tmp_path, capsys):
    code = reproduce.main([
        'dmc_proprio', '--tasks', 'dmc_cup_catch', 'dmc_walker_walk',
        '--seeds', '0', '1', '--steps', '40000', '--configs', 'gpu',
        '--logdir', str(tmp_path / 'sweep'), '--dry'])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0] == (
        "Reproducing DreamerV3's dmc_proprio (dmc_proprio-dreamerv3.json.gz): "
        f'2 tasks x 2 seeds = 4 runs in {tmp_path / "sweep"}, 1 at a time.')
    assert '  tasks: dmc_cup_catch dmc_walker_walk' in lines
    assert ('  each run: python -m embodied.main --configs dmc_proprio gpu '
            '--script parallel --run.steps 40000 --task TASK --seed SEED') in lines
    assert ("  budget: 40000 env steps on the published axis (the original's "
            "driver's steps, reset steps included, times env.dmc.repeat = 1): "
            'run.steps 40000') in lines
    # The block's ratio 1024 over its 16 x 64 batches: one update an env step.
    assert '  train: ratio 1024, batch 16 x 64: 40000 updates a run' in lines
    assert not (tmp_path / 'sweep').exists()  # nothing started


def test_defaults_run_every_published_task_and_seed(tmp_path, capsys):
    """Atari 100k: every published game under our names, as many seeds as
    were published, to the published axis's end, which counts frames:
    run.steps is a quarter of it (env.atari100k.repeat 4)."""
    assert reproduce.main(['atari100k', '--configs', '--logdir',
                           str(tmp_path), '--dry']) == 0
    out = capsys.readouterr().out
    games = sorted({r.task for r in published.load('atari100k')})
    assert len(games) == 26
    tasks = re.search(r'^  tasks: (.*)$', out, re.M).group(1).split()
    assert tasks == ['atari100k_' + g[len('atari_'):] for g in games]
    assert '  seeds: 0 1 2 3 4' in out
    assert 'times env.atari100k.repeat = 4): run.steps 99997' in out
    assert '26 tasks x 5 seeds = 130 runs' in out


@pytest.mark.parametrize('argv, message', [
    (['crafter'], 'crafter: not a suite DreamerV3 published'),
    (['dmc_proprio', '--tasks', 'dmc_humanoid_walk'],
     '--tasks dmc_humanoid_walk: DreamerV3 published no runs of it'),
    (['dmc_proprio', '--tasks', 'dmc_walker_walk', '--', '--run.steps', '5'],
     '--run.steps: set by the reproduction (use --steps'),
    (['dmc_proprio', '--tasks', 'dmc_walker_walk', '--', '--bogus.key', '1'],
     "Unknown flag '--bogus.key'"),
    (['dmc_proprio', '--tasks', 'dmc_walker_walk', '--', '--script',
      'eval_only'], '--script eval_only: a sweep runs'),
])
def test_bad_input_is_one_line_before_anything_starts(tmp_path, capsys, argv,
                                                       message):
    logdir = tmp_path / 'sweep'
    assert reproduce.main([*argv[:1], '--logdir', str(logdir), *argv[1:]]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith('error: ') and message in captured.err, (
        captured.err)
    assert len(captured.err.strip().splitlines()) == 1
    assert not logdir.exists()


def test_page_commands_parse(tmp_path, capsys):
    """docs/reproducing.md's reproduce commands (test_doc_command does not
    run them: hours on a GPU) as the page writes them, stopped before the
    timing with --dry."""
    commands = [c for c in test_user_paths.page_commands(PAGE.read_text())
                if c.startswith('python -m embodied.reproduce')]
    assert len(commands) >= 2, commands
    for index, command in enumerate(commands):
        argv = shlex.split(command)[3:]
        code = reproduce.main([*argv, '--logdir', str(tmp_path / str(index)),
                               '--dry'])
        assert code == 0, (command, capsys.readouterr())
        assert 'Reproducing DreamerV3' in capsys.readouterr().out


@pytest.mark.slow
def test_tiny_reproduction_prints_the_table_and_a_rerun_skips(tmp_path):
    """The dmc_proprio block at the debug size, one env, two seeds, each to
    1100 env steps on the published axis, through the sweep; the table's
    row at the published 10000 is our seeds' episodes against the
    published seeds' first bin. With an action repeat of 4 (the axis
    counts env.dmc.repeat) a run is 275 agent steps and its one episode
    250 (1004 on the axis with the reset step): a quarter of the renders
    and updates of repeat 1, the same table."""
    pytest.importorskip('dm_control.suite')
    logdir = tmp_path / 'sweep'
    flags = ('dmc_proprio', '--tasks', 'dmc_cartpole_balance', '--seeds', '0',
             '1', '--steps', '1100', '--configs', 'debug', '--timing_steps',
             '2', '--logdir', logdir, '--reps', '500', '--',
             '--run.envs', '1', '--run.eval_envs', '0', '--run.actor_batch',
             '1', '--run.train_ratio', '8', '--env.dmc.repeat', '4')
    code, out = run(*flags)
    assert code == 0, out[-4000:]
    assert 'Traceback' not in out, out[-4000:]
    assert out.index('Reproducing DreamerV3') < out.index('Train steps/s:') < (
        out.index('Starting 0-dmc_cartpole_balance-dreamerv3-0'))
    assert re.search(r'Train steps/s: [\d.]+ on cpu .* About \d+ s a run', out)
    scores = {}
    for seed in (0, 1):
        rows = [json.loads(line) for line in open(
            logdir / f'{seed}-dmc_cartpole_balance-dreamerv3-{seed}' /
            'scores.jsonl')]
        # The reset record counts: the episode's score is at step 1004 or,
        # as the parallel logger counts the transitions it has received when
        # it writes the score, a few agent steps (4 on the axis each) later
        # on a busy machine.
        step = rows[0]['step']
        assert len(rows) == 1 and 1004 <= step <= 1004 + 4 * 32, rows
        scores[seed] = rows[0]['episode/score']
    first = [r.ys[0] for r in published.load('dmc_proprio')
             if r.task == 'dmc_cartpole_balance']
    mean = np.mean(list(scores.values()))
    row = re.search(r'^\s+10000\s+(\S+)\s+(\S+) (\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+'
                    r'(inside|below|above)$', out, re.M)
    assert row, out[-3000:]
    assert float(row.group(1)) == pytest.approx(mean, abs=0.051)
    assert [float(row.group(i)) for i in (2, 3)] == pytest.approx(
        [scores[0], scores[1]], abs=0.051)
    assert [float(row.group(i)) for i in (4, 5, 6)] == pytest.approx(
        [min(first), max(first), np.mean(first)], abs=0.051)
    mark = ('below' if mean < min(first) else 'above' if mean > max(first)
            else 'inside')
    assert row.group(7) == mark
    assert re.search(rf'^\s+dmc_cartpole_balance\s+dreamerv3\s+2\s+'
                     rf'{int(mark == "inside")}/1\s+10000\s+{mark}$', out, re.M)
    markdown = (logdir / 'reproduction.md').read_text()
    assert (f'| dmc_cartpole_balance | dreamerv3 | 2 | '
            f'{int(mark == "inside")}/1 | 10000 | {mark} |') in markdown
    assert (logdir / 'bands.png').exists()

    # Again: both runs are finished, nothing is timed or run, the same table.
    code, again = run(*flags)
    assert code == 0, again[-3000:]
    assert 'Skipping 0-dmc_cartpole_balance-dreamerv3-0' in again
    assert 'Skipping 1-dmc_cartpole_balance-dreamerv3-1' in again
    assert 'Train steps/s' not in again and 'Starting' not in again
    assert row.group(0) in again
