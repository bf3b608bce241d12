"""Animated GIFs from frame arrays, with pillow."""

import io

import numpy as np


def to_uint8(frames):
    """Frames as uint8 (T, H, W, C) with C in 1, 3 or 4; floats are taken
    to be in [0, 1]."""
    frames = np.asarray(frames)
    if frames.ndim == 3:
        frames = frames[..., None]
    if frames.ndim != 4 or frames.shape[-1] not in (1, 3, 4):
        raise ValueError(
            f'Expected video frames of shape (T, H, W, C) with C in 1, 3 or '
            f'4, got {frames.shape}.')
    if frames.dtype != np.uint8:
        frames = (np.clip(frames, 0, 1) * 255).round().astype(np.uint8)
    return frames


def encode(frames, fps):
    """The bytes of a looping GIF showing `frames` at `fps` frames per
    second. Identical consecutive frames are merged into one longer frame
    (GIF's own compression), so a still scene has fewer frames."""
    images = _images(to_uint8(frames))
    buffer = io.BytesIO()
    images[0].save(
        buffer, format='GIF', save_all=True, append_images=images[1:],
        duration=max(20, round(1000 / fps)), loop=0)
    return buffer.getvalue()


def write(path, frames, fps):
    """Writes `encode(frames, fps)` to `path`."""
    data = encode(frames, fps)
    with open(path, 'wb') as f:
        f.write(data)


def pillow():
    """PIL.Image, or an ImportError that names the extra to install."""
    try:
        from PIL import Image
    except ImportError:
        raise ImportError(
            "Writing GIFs needs pillow: pip install 'embodied[video]'") from None
    return Image


def _images(frames):
    Image = pillow()
    if frames.shape[-1] == 1:
        return [Image.fromarray(frame[..., 0], 'L') for frame in frames]
    return [Image.fromarray(frame[..., :3], 'RGB') for frame in frames]
