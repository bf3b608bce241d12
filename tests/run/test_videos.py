"""Watching a saved agent: eval_only with run.eval_video writes GIFs."""

import re

import numpy as np
import pytest
from PIL import Image

import helpers
import launch
from embodied.envs import dummy
from embodied.outputs import gif
from embodied.run import videos

LENGTH = 12
SIZE = (16, 24)


def closest_count(frame):
    """The count mod 256 whose dummy image is closest to `frame`."""
    candidates = dummy.image_for(np.arange(256), SIZE).astype(int)
    errors = np.abs(candidates - frame.astype(int)[None]).mean((1, 2, 3))
    return int(np.argmin(errors))


def test_eval_only_saves_episodes_of_a_saved_agent_as_gifs(tmp_path):
    flags = (
        '--configs', 'debug', '--agent_impl', 'testing', '--task',
        'dummy_disc', '--env.dummy.length', LENGTH, '--env.dummy.size',
        *SIZE, '--run.envs', 2)
    trained = tmp_path / 'trained'
    result = launch.run('--script', 'train', *flags, '--run.steps', 100,
                        '--logdir', trained)
    assert result.returncode == 0, result.stdout[-3000:]
    watch = tmp_path / 'watch'
    result = launch.run(
        '--script', 'eval_only', *flags, '--run.from_checkpoint', trained,
        '--run.eval_video', 3, '--run.steps', 200, '--logdir', watch)
    assert result.returncode == 0, result.stdout[-3000:]
    files = sorted((watch / 'videos').glob('*.gif'))
    assert len(files) == 3, files  # The first 3 episodes, not all ~15.
    assert len(re.findall(r'Saved \d+ frames of episode', result.stdout)) == 3
    for path in files:
        assert re.fullmatch(r'image-step\d+-env[01]\.gif', path.name)
        frames = helpers.gif_frames(path)
        # An episode: the reset observation and LENGTH steps.
        assert len(frames) == LENGTH + 1
        assert frames[0].shape == SIZE + (3,)
        # Dummy images show the env's step count: the frames are those of
        # consecutive counts, in order (matched to the closest count, as a
        # GIF's palette may shift colors a little).
        counts = [closest_count(frame) for frame in frames]
        assert np.diff(counts).tolist() == [1] * LENGTH, counts


def test_gif_frames_and_duration(tmp_path):
    frames = dummy.image_for(np.arange(5), (8, 8))
    path = tmp_path / 'x.gif'
    gif.write(path, frames, fps=10)
    back = helpers.gif_frames(path)
    assert len(back) == 5
    with Image.open(path) as image:
        assert image.info['duration'] == 100
        assert image.info['loop'] == 0
    gray = gif.encode(np.zeros((3, 4, 4, 1), np.float32) + 0.5, fps=5)
    assert gray.startswith(b'GIF89a')
    with pytest.raises(ValueError, match=r'\(T, H, W, C\)'):
        gif.encode(np.zeros((3, 4, 4, 2), np.uint8), fps=5)


def test_env_without_images_warns_once(tmp_path, capsys):
    saver = videos.EpisodeVideos(tmp_path / 'videos', 2, step=0)
    for _ in range(2):
        saver.add(dict(vector=np.zeros(3, np.float32), is_first=True,
                       is_last=False))
        saver.add(dict(vector=np.zeros(3, np.float32), is_first=False,
                       is_last=True))
    assert capsys.readouterr().out.count('no image observation') == 1
    assert not (tmp_path / 'videos').exists()
