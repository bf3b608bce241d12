"""The side-by-side learning benchmark's verdict (`devtools.learning_side_by_side`):
where learning starts and whether the sides' seed ranges overlap."""

import json

import numpy as np

from devtools import learning_side_by_side as side


def test_learning_starts_at_the_first_bin_either_side_rises_by_the_margin():
    ours = np.array([300, 350, 420, 600])
    theirs = np.array([320, 330, 500, 700])  # +180 at bin 2; ours +120 there.
    assert side.learning_start([ours, theirs], margin=150) == 2
    assert side.learning_start([ours, theirs], margin=100) == 2
    assert side.learning_start([ours, theirs], margin=40) == 1
    # A rise of exactly the margin does not count; none at all gives None.
    assert side.learning_start([np.array([300, 400])], margin=100) is None
    assert side.learning_start([np.array([300, 290])], margin=1) is None
    # A negative margin looks for a fall, as a loss's.
    loss = np.array([4.0, 3.8, 2.5, 2.0])
    assert side.learning_start([loss], margin=-1) == 2
    assert side.learning_start([loss], margin=1) is None


def test_overlap_compares_seed_min_max_per_bin():
    ours = np.array([[100, 500, 700], [200, 600, np.nan]])
    theirs = np.array([[150, 610, 900], [180, 650, 950]])
    # [100, 200] meets [150, 180]; [500, 600] misses [610, 650]; a bin where
    # our only seed is 700 misses [900, 950].
    assert side.overlaps(ours, theirs).tolist() == [True, False, False]
    # Touching ends overlap; a side without any value in a bin does not.
    assert side.overlaps(np.array([[1.0, np.nan]]),
                         np.array([[1.0, 2.0]])).tolist() == [True, False]


def test_episodes_count_at_the_nearest_bin_end_up_to_the_budget():
    from embodied.plot import runs as runslib
    # Two envs' 1000-frame episodes end at 2004 and 2008 (a reset record
    # each); the third pair is past a budget of 4000 steps.
    steps = np.array([2004, 2008, 4012, 4016, 6020, 6024], float)
    run = runslib.Run(None, 'x', steps, steps * np.nan,
                      np.array([300, 310, 500, 520, 900, 910], float))
    empty = runslib.Run(None, 'y', steps[:2], steps[:2] * np.nan,
                        np.array([100, np.nan]))
    ends, table = side.bin_scores([run, empty], 2000, 4000)
    assert ends.tolist() == [2000, 4000]
    assert table[0].tolist() == [305, 510]
    assert table[1, 0] == 100 and np.isnan(table[1, 1])


def test_permutation_p_tells_apart_separate_samples_and_not_the_same():
    same = np.array([1.0, 2.0, 3.0, 4.0])
    assert side.permutation_p(same, same) == 1.0
    low, high = np.arange(8.0), np.arange(8.0) + 100
    # Only the observed split and its mirror are as far apart: 2 of C(16, 8).
    assert side.permutation_p(low, high) < 0.01
    assert np.isnan(side.permutation_p([], high))


def write_run(folder, scores):
    folder.mkdir(parents=True)
    with open(folder / 'scores.jsonl', 'w') as f:
        for step, score in scores:
            f.write(json.dumps({'step': step, 'episode/score': score}) + '\n')


def test_analyze_prints_each_seed_per_bin_and_the_verdict(tmp_path, capsys):
    for seed, offset in ((0, 0), (1, 20)):
        write_run(tmp_path / f'original-{seed}',
                  [(900, 300 + offset), (1900, 500 + offset),
                   (2900, 700 + offset)])
        write_run(tmp_path / f'ours-{seed}',
                  [(950, 310 + offset), (1950, 480 + offset),
                   (2950, 690 + offset)])
    code = side.main(['analyze', '--outdir', str(tmp_path), '--bin', '1000',
                      '--steps', '3000', '--margin', '100'])
    out = capsys.readouterr().out
    assert code == 0
    rows = {line.split(' | ')[0]: line for line in out.splitlines()}
    assert rows['| 2,000'].startswith(
        '| 2,000 | 500 | 520 | 510 | 480 | 500 | 490 | yes | ')
    assert rows['| 1,000'].startswith(
        '| 1,000 | 300 | 320 | 310 | 310 | 330 | 320 | (yes) | ')
    assert 'Learning starts at the bin ending at env step 2,000' in out
    assert 'overlaps the original\'s at every bin' in out


def test_analyze_says_plainly_where_the_ranges_part(tmp_path, capsys):
    write_run(tmp_path / 'original-0', [(1004, 300), (2008, 800)])
    write_run(tmp_path / 'ours-0', [(1004, 300), (2008, 350)])
    code = side.main(['analyze', '--outdir', str(tmp_path), '--bin', '1000',
                      '--steps', '2000', '--margin', '100'])
    out = capsys.readouterr().out
    assert code == 1
    assert 'does NOT overlap the original\'s at env steps 2,000' in out


def test_the_terminal_preset_changes_our_task_alone(tmp_path):
    """`--preset cartpole_terminal`: the original's command line as in
    `cartpole`; ours names the env whose time limit terminates."""
    preset = side.PRESETS['cartpole_terminal']
    theirs, _ = side.command('original', preset, 0, tmp_path / 'original-0',
                             'python', str(tmp_path))
    ours, _ = side.command('ours', preset, 0, tmp_path / 'original-0',
                           'python', str(tmp_path))
    assert theirs[2:] == side.command(
        'original', side.PRESETS['cartpole'], 0, tmp_path / 'original-0',
        'python', str(tmp_path))[0][2:]
    at = ours.index('--task')
    assert ours[at + 1] == 'devtools.cartpole_terminal:CartPole'
    assert ours[at + 2:] == theirs[theirs.index('--task') + 2:]


def test_the_time_limit_ends_the_episode_as_a_termination():
    import gymnasium
    from devtools import cartpole_terminal
    env = cartpole_terminal.TruncationEnds(
        gymnasium.make('CartPole-v1', max_episode_steps=3))
    env.reset(seed=0)
    ends = [env.step(step % 2)[2:4] for step in range(3)]
    assert ends == [(False, False), (False, False), (True, False)]
