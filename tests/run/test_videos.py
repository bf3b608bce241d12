"""Watching a saved agent: eval_only with run.eval_video writes GIFs and
MP4s, of image observations and of frames an env renders (`log/image`)."""

import io
import re
import sys

import numpy as np
import pytest
from PIL import Image

import helpers
import launch
from embodied.envs import cartpole
from embodied.envs import dummy
from embodied.outputs import gif
from embodied.outputs import mp4
from embodied.run import videos

LENGTH = 12
SIZE = (16, 24)


def closest_count(frame):
    """The count mod 256 whose dummy image is closest to `frame`."""
    candidates = dummy.image_for(np.arange(256), SIZE).astype(int)
    errors = np.abs(candidates - frame.astype(int)[None]).mean((1, 2, 3))
    return int(np.argmin(errors))


def train_then_watch(tmp_path, flags, steps, *watch_flags):
    """Trains `steps` steps, then runs eval_only from that checkpoint with
    `watch_flags` added; returns its logdir and its CompletedProcess."""
    trained, watch = tmp_path / 'trained', tmp_path / 'watch'
    result = launch.run('--script', 'train', *flags, '--run.steps', steps,
                        '--logdir', trained)
    assert result.returncode == 0, result.stdout[-3000:]
    result = launch.run(
        '--script', 'eval_only', *flags, '--run.from_checkpoint', trained,
        *watch_flags, '--logdir', watch)
    assert result.returncode == 0, result.stdout[-3000:]
    return watch, result


def test_eval_only_saves_episodes_of_a_saved_agent_as_gifs(tmp_path):
    flags = (
        '--configs', 'debug', '--agent_impl', 'testing', '--task',
        'dummy_disc', '--env.dummy.length', LENGTH, '--env.dummy.size',
        *SIZE, '--run.envs', 2)
    watch, result = train_then_watch(
        tmp_path, flags, 100, '--run.eval_video', 3, '--run.steps', 200)
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


def mp4_frames(path):
    """The RGB frames of an MP4, decoded by ffmpeg."""
    import imageio_ffmpeg
    reader = imageio_ffmpeg.read_frames(str(path))
    width, height = next(reader)['size']
    return [np.frombuffer(frame, np.uint8).reshape((height, width, 3))
            for frame in reader]


def gif_milliseconds(path):
    """How long a GIF plays once: the sum of its frames' durations."""
    with Image.open(path) as image:
        total = 0
        for index in range(image.n_frames):
            image.seek(index)
            total += image.info['duration']
    return total


def test_eval_only_videos_of_a_vector_task_that_renders(tmp_path):
    """CartPole's observation is a vector; with env.cartpole.render its
    frames reach the GIFs, the MP4s and TensorBoard."""
    flags = ('--configs', 'debug', '--agent_impl', 'testing', '--task',
             'cartpole_balance', '--env.cartpole.length', 10, '--run.envs', 1)
    watch, result = train_then_watch(
        tmp_path, flags, 40, '--env.cartpole.render', True,
        '--env.cartpole.render_size', 32, 48, '--run.eval_video', 2,
        '--run.steps', 30, '--logger.outputs', 'jsonl', 'tensorboard')
    counts = [int(n) for n in re.findall(
        r'Saved (\d+) frames of episode', result.stdout)]
    assert len(counts) == 2, result.stdout[-3000:]
    upright = cartpole.draw(np.zeros(4), (32, 48)).astype(int)
    for count in counts:
        assert 2 <= count <= 11  # The reset frame and up to 10 steps.
    gifs = sorted((watch / 'videos').glob('*.gif'))
    mp4s = sorted((watch / 'videos').glob('*.mp4'))
    assert [p.name for p in gifs] == [
        p.with_suffix('.gif').name for p in mp4s]
    assert all(re.fullmatch(r'log_image-step\d+-env0\.gif', p.name)
               for p in gifs), gifs
    for path, count in zip(gifs, counts):
        frames = helpers.gif_frames(path)
        movie = mp4_frames(path.with_suffix('.mp4'))
        # A frame per step; the GIF merges identical neighbours into one
        # longer frame, and lasts as long (each frame's duration rounded to
        # GIF's hundredths of a second).
        assert len(movie) == count, path
        exact = count * 1000 / videos.FPS
        assert abs(gif_milliseconds(path) - exact) <= 10 * len(frames)
        assert frames[0].shape == movie[0].shape == (32, 48, 3)
        # The episode starts near upright in the middle of the track (the
        # MP4 is lossy: close, not equal).
        assert np.abs(frames[0] - upright).mean() < 8
        assert np.abs(movie[0].astype(int) - frames[0]).mean() < 8
    # TensorBoard: the episodes' frames as an animated GIF.
    from tensorboard.backend.event_processing import event_accumulator as ea
    events = ea.EventAccumulator(str(watch), size_guidance={ea.IMAGES: 0})
    events.Reload()
    video, *_ = events.Images('epstats/policy_log/image')
    frames = helpers.gif_frames(io.BytesIO(video.encoded_image_string))
    assert (video.height, video.width) == (32, 48) and len(frames) >= 2


def test_mp4_of_gray_odd_sized_frames(tmp_path):
    frames = dummy.image_for(np.arange(6), (9, 7))[..., :1]
    mp4.write(tmp_path / 'x.mp4', frames, fps=10)
    movie = mp4_frames(tmp_path / 'x.mp4')
    assert len(movie) == 6 and movie[0].shape == (10, 8, 3)
    # Gray in, gray out (within the codec's loss); the padding repeats
    # the last row and column.
    assert np.abs(movie[3][:9, :7].astype(int) - frames[3]).mean() < 8
    assert np.abs(movie[3][9].astype(int) - movie[3][8]).mean() < 8


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
    out = capsys.readouterr().out
    assert out.count('no image observation') == 1
    assert not (tmp_path / 'videos').exists()


def test_without_imageio_ffmpeg_gifs_only_and_one_line(
        tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, 'imageio_ffmpeg', None)
    saver = videos.EpisodeVideos(tmp_path / 'videos', 1, step=0)
    image = lambda t: dummy.image_for(np.asarray(t), (4, 4))
    saver.add(dict(image=image(0), is_first=True, is_last=False))
    saver.add(dict(image=image(1), is_first=False, is_last=True))
    out = capsys.readouterr().out
    assert out.count("MP4s need imageio-ffmpeg: pip install 'embodied[video]'") == 1
    assert [p.name for p in sorted((tmp_path / 'videos').iterdir())] == [
        'image-step0-env0.gif']
