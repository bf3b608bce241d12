"""Evaluated episodes saved as GIFs (`run.eval_video`)."""

import collections

import elements
import numpy as np

from embodied.outputs import gif
from embodied.run import episodes

FPS = 15


class EpisodeVideos:
    """A driver callback that saves the image observations (uint8, H x W x
    C) of the first `count` finished episodes as looping GIFs in `folder`,
    one file per image key: `{key}-step{step}-env{worker}.gif`, where `step`
    is the value of the `step` counter when the episode ended. Every
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
                      '(uint8, height x width x channels); no video saved.',
                      flush=True)
                self.warned = True
            return
        self.folder.mkdir()
        for key, images in frames.items():
            name = key.replace('/', '_')
            path = self.folder / f'{name}-step{int(self.step)}-env{worker}.gif'
            gif.write(str(path), np.stack(images), self.fps)
            self.paths.append(path)
            print(f'Saved {len(images)} frames of episode {self.saved + 1} '
                  f'to {path}', flush=True)
        self.saved += 1
