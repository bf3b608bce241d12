"""Logger outputs: JSONL with a time column, and TensorBoard event files
read back with tensorboard's own event reader."""

import io
import json
import sys

import elements
import numpy as np
import pytest

import helpers
import launch
from embodied import outputs
from embodied.outputs import jsonl


def read_events(logdir):
    """tensorboard's reader (no TensorFlow): an EventAccumulator with
    every event kept."""
    from tensorboard.backend.event_processing import event_accumulator as ea
    acc = ea.EventAccumulator(
        str(logdir), size_guidance={ea.SCALARS: 0, ea.IMAGES: 0})
    acc.Reload()
    return acc


def test_jsonl_times_interpolated_by_step_between_writes(tmp_path, monkeypatch):
    clock = iter([100.0, 110.0, 130.0, 130.0])  # creation, then one per write
    monkeypatch.setattr(jsonl.time, 'monotonic', lambda: next(clock))
    output = outputs.JSONLOutput(tmp_path, 'scores.jsonl', 'score',
                                 parallel=False)
    output([(10, 'episode/score', np.float64(1.0)),
            (20, 'fps', np.float64(5.0)),
            (20, 'episode/image', np.zeros((2, 2, 3), np.uint8))])
    output([(30, 'episode/score', np.float64(2.0)),
            (40, 'episode/score', np.float64(3.0)),
            (40, 'fps', np.float64(5.0))])
    output([(40, 'episode/score', np.float64(4.0))])  # no step since
    rows = [json.loads(line)
            for line in (tmp_path / 'scores.jsonl').read_text().splitlines()]
    # Write 1 at 10 s, step 20: step 10 half-way from (0, 0 s).
    # Write 2 at 30 s, step 40: steps 30 and 40 between (20, 10 s) and it.
    assert rows == [
        {'step': 10, 'time': 5.0, 'episode/score': 1.0},
        {'step': 30, 'time': 20.0, 'episode/score': 2.0},
        {'step': 40, 'time': 30.0, 'episode/score': 3.0},
        {'step': 40, 'time': 30.0, 'episode/score': 4.0}]


def test_jsonl_keeps_every_value_logged_at_one_step(tmp_path):
    # Envs that end episodes at the same step log several scores there.
    output = outputs.JSONLOutput(tmp_path, 'scores.jsonl', 'score',
                                 parallel=False)
    output([(8, 'episode/score', np.float64(s)) for s in (1.0, 2.0, 3.0)] +
           [(9, 'episode/score', np.float64(4.0))])
    rows = [json.loads(line)
            for line in (tmp_path / 'scores.jsonl').read_text().splitlines()]
    assert [(r['step'], r['episode/score']) for r in rows] == [
        (8, 1.0), (8, 2.0), (8, 3.0), (9, 4.0)]


def test_jsonl_time_continues_after_a_resume(tmp_path, monkeypatch):
    (tmp_path / 'metrics.jsonl').write_text(
        '{"step": 100, "time": 50.0, "a": 1.0}\n'
        '{"step": 120, "b": 2.0}\n'          # no time: not an anchor
        '{"step": 130, "time": 60.0, "a": 1')  # cut short by a crash
    clock = iter([0.0, 20.0])
    monkeypatch.setattr(jsonl.time, 'monotonic', lambda: next(clock))
    output = outputs.JSONLOutput(tmp_path, parallel=False)
    output([(110, 'a', np.float64(3.0)), (120, 'a', np.float64(4.0))])
    rows = [json.loads(line) for line in
            (tmp_path / 'metrics.jsonl').read_text().splitlines()[-2:]]
    # From (step 100, 50 s) of the last launch to (120, 50 + 20 s).
    assert rows == [{'step': 110, 'time': 60.0, 'a': 3.0},
                    {'step': 120, 'time': 70.0, 'a': 4.0}]


def test_jsonl_rewind_finds_the_cut_reading_backwards():
    """The cut after the last line at or before a step, found block by
    block from the end, equals a full forward scan, with lines cut short
    by a crash and with or without a final newline."""
    rng = np.random.default_rng(0)

    def forward(data, step):
        offset = cut = 0
        for line in data.split(b'\n'):
            row = jsonl._parse(line)
            if row is not None and row['step'] <= step:
                cut = min(offset + len(line) + 1, len(data))
            offset += len(line) + 1
        return cut

    for _ in range(500):
        steps = sorted(rng.choice(100, rng.integers(0, 12), replace=False))
        lines = [json.dumps({'step': int(s), 'x': 'y' * int(rng.integers(
            20))}).encode() for s in steps]
        for _ in range(rng.integers(3)):
            lines.insert(rng.integers(len(lines) + 1), b'{"step": 5')
        data = b'\n'.join(lines) + (b'\n' if rng.random() < 0.7 else b'')
        step = int(rng.integers(-1, 102))
        block = int(rng.integers(1, 30))
        assert jsonl._end_of_last_line_upto(
            io.BytesIO(data), step, block) == forward(data, step)


def test_jsonl_rewind_keeps_a_cut_line_and_moves_later_steps(tmp_path):
    path = tmp_path / 'metrics.jsonl'
    rows = [json.dumps({'step': s, 'time': s}) for s in range(0, 5000, 10)]
    # Lines cut short by a crash, one before the save's step and one after.
    path.write_text('\n'.join(
        rows[:400] + ['{"step": 39'] + rows[400:420] + ['{"step": 41'] +
        rows[420:]) + '\n')
    out = outputs.JSONLOutput(tmp_path, parallel=False)
    assert out.rewind(4100) == 89
    kept = path.read_text().splitlines()
    assert kept == (rows[:400] + ['{"step": 39'] + rows[400:411] +
                    ['{"step": 41'])
    moved = (tmp_path / 'metrics.rewound.jsonl').read_text().splitlines()
    assert moved == rows[411:]
    assert out.rewind(4100) == 0


def test_tensorboard_output_scalars_images_and_video(tmp_path):
    step = elements.Counter()
    logger = elements.Logger(step, [outputs.TensorBoardOutput(tmp_path, fps=10)])
    video = np.stack([np.full((6, 8, 3), 20 * i, np.uint8) for i in range(7)])
    for i in range(3):
        step.increment(5)
        logger.add({'loss': 0.5 * i, 'hist': np.arange(4.0),
                    'gray': np.full((3, 4), 0.5, np.float32)}, prefix='train')
        logger.add({'policy_image': video[:i + 5]}, prefix='epstats')
        logger.add({'note': f'text {i}'})
        logger.write()
    logger.close()
    acc = read_events(tmp_path)
    assert 'tensorflow' not in sys.modules  # Neither writer nor reader.
    tags = acc.Tags()
    assert tags['scalars'] == ['train/loss']
    assert [(e.step, e.value) for e in acc.Scalars('train/loss')] == [
        (5, 0.0), (10, 0.5), (15, 1.0)]
    assert tags['histograms'] == ['train/hist']
    assert sorted(tags['images']) == ['epstats/policy_image', 'train/gray']
    gray = acc.Images('train/gray')[0]
    assert (gray.width, gray.height) == (4, 3)
    videos = acc.Images('epstats/policy_image')
    assert [e.step for e in videos] == [5, 10, 15]
    for i, event in enumerate(videos):
        assert (event.width, event.height) == (8, 6)
        frames = helpers.gif_frames(io.BytesIO(event.encoded_image_string))
        assert len(frames) == i + 5
        assert [int(f[0, 0, 0]) for f in frames] == [20 * k for k in range(i + 5)]


def test_missing_tensorboardx_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, 'tensorboardX', None)
    with pytest.raises(ImportError, match=r"embodied\[tensorboard\]"):
        outputs.TensorBoardOutput(tmp_path)


@pytest.mark.parametrize('script', ['train', 'parallel'])
def test_run_writes_tensorboard_and_timed_scores(tmp_path, script):
    """A real run with both outputs on dummy_disc (an `image` obs): the
    event file holds the episode scores of scores.jsonl at the same steps,
    and the episodes of env 0 as GIFs of length + 1 frames."""
    logdir = tmp_path / 'run'
    length = 20
    result = launch.run(
        '--script', script, '--configs', 'debug', '--agent_impl', 'testing',
        '--task', 'dummy_disc', '--env.dummy.length', length,
        '--env.dummy.size', 16, 16, '--run.envs', 2, '--run.steps', 200,
        '--run.log_every', -1 if script == 'train' else 1,
        '--logger.outputs', 'jsonl', 'tensorboard',
        '--logdir', logdir)
    assert result.returncode == 0, result.stdout[-3000:]
    scores = [row for row in launch.metrics(logdir, 'scores.jsonl')
              if 'episode/score' in row]  # Not eval_episode/score.
    assert len(scores) >= 8
    times = [row['time'] for row in scores]
    assert times == sorted(times) and times[0] > 0
    acc = read_events(logdir)
    assert [(e.step, e.value) for e in acc.Scalars('episode/score')] == [
        (row['step'], row['episode/score']) for row in scores]
    assert all(row['episode/score'] == length for row in scores)
    videos = acc.Images('epstats/policy_image')
    assert videos
    for event in videos:
        frames = helpers.gif_frames(io.BytesIO(event.encoded_image_string))
        assert len(frames) % (length + 1) == 0, len(frames)
