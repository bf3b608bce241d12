"""MP4 (H.264) videos from frame arrays, with the ffmpeg binary that the
imageio-ffmpeg package ships (`pip install 'embodied[video]'`)."""

import numpy as np

from . import gif

INSTALL = "pip install 'embodied[video]'"


def available():
    """Whether MP4s can be written: imageio-ffmpeg imports."""
    try:
        import imageio_ffmpeg  # noqa: F401
    except ImportError:
        return False
    return True


def write(path, frames, fps):
    """Writes `frames` (T, H, W, C), uint8 or floats in [0, 1], as an H.264
    MP4 at `fps` frames per second, one video frame per array frame.
    Gray frames become RGB and an alpha channel is dropped; an odd height
    or width gets one more row or column (a copy of the last), as the
    yuv420p pixel format that players expect needs even sizes."""
    import imageio_ffmpeg
    frames = _rgb(gif.to_uint8(frames))
    _, height, width, _ = frames.shape
    writer = imageio_ffmpeg.write_frames(
        str(path), (width, height), fps=fps, codec='libx264',
        pix_fmt_in='rgb24', pix_fmt_out='yuv420p', macro_block_size=1,
        ffmpeg_log_level='error')
    writer.send(None)  # Starts ffmpeg.
    try:
        for frame in frames:
            writer.send(np.ascontiguousarray(frame))
    finally:
        writer.close()


def _rgb(frames):
    if frames.shape[-1] == 1:
        frames = np.repeat(frames, 3, -1)
    frames = frames[..., :3]
    pad = [(0, 0), (0, frames.shape[1] % 2), (0, frames.shape[2] % 2), (0, 0)]
    return np.pad(frames, pad, mode='edge')
