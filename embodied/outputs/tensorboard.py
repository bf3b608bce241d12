"""TensorBoard event files written with tensorboardX (no TensorFlow)."""

import os
import time

import elements
import numpy as np

from . import gif

INSTALL = "pip install 'embodied[tensorboard]'"


class TensorBoardOutput(elements.logger.AsyncOutput):
    """Writes the logger's metrics as TensorBoard summaries into an event
    file in `logdir`: scalars, text, histograms (1-D), images (2-D and 3-D)
    and videos (4-D, e.g. the episodes' `epstats/policy_image`) as animated
    GIFs, shown in the images dashboard. Writes happen on a background
    thread, like elements' outputs, and are on disk when each write ends.
    """

    def __init__(self, logdir, fps=20, videos=True, parallel=True):
        super().__init__(self._write, parallel)
        try:
            from tensorboardX import event_file_writer
            from tensorboardX import summary
            from tensorboardX.proto import event_pb2
        except ImportError:
            raise ImportError(
                f'The tensorboard logger output needs tensorboardX: '
                f'{INSTALL}') from None
        self._summary = summary
        self._event = event_pb2.Event
        logdir = str(logdir)
        os.makedirs(logdir, exist_ok=True)
        # The synchronous writer: tensorboardX's SummaryWriter queues events
        # for a daemon thread, so a flush does not mean they are on disk.
        self._file = event_file_writer.EventsWriter(
            os.path.join(logdir, 'events'))
        self._fps = fps
        self._videos = videos

    def rewind(self, step):
        """Tells TensorBoard that the run resumed at `step`: it drops the
        events after `step` that earlier launches wrote (a session start
        event, as TensorBoard's own purge of orphaned data expects)."""
        from tensorboardX.proto import event_pb2
        self.wait()
        self._file.write_event(self._event(
            wall_time=time.time(), step=int(step),
            session_log=event_pb2.SessionLog(
                status=event_pb2.SessionLog.START)))
        self._file.flush()
        return 0

    def _write(self, summaries):
        for step, name, value in summaries:
            proto = self._proto(name, value)
            if proto is not None:
                self._file.write_event(self._event(
                    wall_time=time.time(), step=int(step), summary=proto))
        self._file.flush()

    def close(self):
        self.wait()
        self._file.close()

    def _proto(self, name, value):
        summary = self._summary
        if isinstance(value, str):
            return summary.text(name, value)
        if value.ndim == 0:
            return summary.scalar(name, float(value))
        if value.ndim == 1:
            value = value.astype(np.float64)
            value = value[np.isfinite(value)]
            if not value.size:
                return None
            return summary.histogram(name, value, bins='auto')
        if value.ndim in (2, 3):
            if value.ndim == 3 and value.shape[-1] not in (1, 3, 4):
                raise ValueError(
                    f"TensorBoard: metric '{name}' has shape {value.shape}; "
                    f"an image needs 1, 3 or 4 channels last.")
            return summary.image(
                name, _image(value), dataformats='HWC'[:value.ndim])
        if value.ndim == 4 and self._videos and len(value):
            return self._video(name, value)
        return None

    def _video(self, name, frames):
        frames = gif.to_uint8(frames)
        _, height, width, channels = frames.shape
        proto = self._summary.Summary
        image = proto.Image(
            height=height, width=width, colorspace=min(channels, 3),
            encoded_image_string=gif.encode(frames, self._fps))
        return proto(value=[proto.Value(tag=name, image=image)])


def _image(value):
    """uint8 images as they are; others scaled from [0, 1]."""
    if value.dtype == np.uint8:
        return value
    return np.clip(value.astype(np.float32), 0, 1)
