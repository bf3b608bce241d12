"""Evaluated episodes saved as GIFs and MP4s (`run.eval_video`)."""

import collections

import elements
import numpy as np

from embodied.outputs import gif
from embodied.outputs import mp4
from embodied.run import episodes

FPS = 15


class EpisodeVideos:
    """A driver callback that saves the frames of the first `count` finished
    episodes as looping GIFs in `folder`, and as MP4s beside them where
    imageio-ffmpeg is installed (`embodied[video]`; without it, one line
    says so and GIFs alone are written). The frames are the image
    observations (uint8, H x W x C), the frames an env renders for the
    logger (`log/image`, e.g. `env.gym.render`) included: one file per key,
    `{key}-step{step}-env{worker}.gif` (`/` in a key becomes `_`), where
    `step` is the value of the `step` counter when the episode ended. Every
    observation of the episode is a frame, the reset one included.

        videos = EpisodeVideos(logdir / 'videos', 3, step)
        driver.on_step(videos.add)
    """

    def __init__(self, folder, count, step, fps=FPS):
        gif.pillow()  # Fail now, not after the first episode.
        self.folder = elements.Path(folder)
        self.count = int(count)
        self.step = step
        self.fps = fps
        self.mp4 = mp4.available()
        if not self.mp4:
            print(f'run.eval_video: writing GIFs only; MP4s need '
                  f'imageio-ffmpeg: {mp4.INSTALL}', flush=True)
        self.saved = 0
        self.paths = []
        self.frames = {}
        self.warned = False

    def add(self, tran, worker=0):
        if self.saved >= self.count:
            return
        if tran['is_first'] or worker not in self.frames:
            self.frames[worker] = collections.defaultdict(list)
        frames = self.frames[worker]
        for key, value in tran.items():
            if episodes.is_image(value):
                frames[key].append(value)
        if tran['is_last']:
            self._save(worker, self.frames.pop(worker))

    def _save(self, worker, frames):
        if not frames:
            if not self.warned:
                print('run.eval_video: the env has no image observation '
                      '(uint8, height x width x channels) and renders no '
                      'frames (log/image, e.g. env.gym.render True); no '
                      'video saved.', flush=True)
                self.warned = True
            return
        self.folder.mkdir()
        for key, images in frames.items():
            name = key.replace('/', '_')
            path = self.folder / f'{name}-step{int(self.step)}-env{worker}'
            frames = np.stack(images)
            paths = [path.parent / (path.name + '.gif')]
            gif.write(str(paths[0]), frames, self.fps)
            if self.mp4:
                paths.append(path.parent / (path.name + '.mp4'))
                mp4.write(str(paths[1]), frames, self.fps)
            self.paths += paths
            print(f'Saved {len(images)} frames of episode {self.saved + 1} '
                  f'to {" and ".join(map(str, paths))}', flush=True)
        self.saved += 1
