"""A dependency-free PNG line chart (numpy raster + zlib), enough to plot a
learning curve without matplotlib."""

import struct
import zlib

import numpy as np

# 3x5 bitmaps for the characters the axis labels use.
GLYPHS = {
    '0': '111101101101111', '1': '010110010010111', '2': '111001111100111',
    '3': '111001111001111', '4': '101101111001001', '5': '111100111001111',
    '6': '111100111101111', '7': '111001010010010', '8': '111101111101111',
    '9': '111101111001111', '.': '000000000000010', ' ': '000000000000000',
    'k': '100101110101101', 's': '011100010001110', 'c': '000011100100011',
    'o': '000111101101111', 'r': '000110101100100', 'e': '000011111100011',
    'm': '000111111101101', 'i': '010000010010010', 'n': '000110101101101',
    'u': '000101101101111', 't': '010111010010011', 'p': '111101111100100',
    'v': '000101101101010', 'w': '000101101111111', 'a': '000011101101011',
    'l': '010010010010010', '/': '001001010100100', '-': '000000111000000',
}


def _text(image, x, y, text, color, scale=2):
    for char in text:
        glyph = GLYPHS.get(char, GLYPHS[' '])
        bits = np.array([int(b) for b in glyph], bool).reshape(5, 3)
        bits = bits.repeat(scale, 0).repeat(scale, 1)
        h, w = bits.shape
        region = image[y:y + h, x:x + w]
        region[bits[:region.shape[0], :region.shape[1]]] = color
        x += (3 + 1) * scale


def _line(image, x0, y0, x1, y1, color):
    steps = int(max(abs(x1 - x0), abs(y1 - y0), 1))
    xs = np.linspace(x0, x1, steps + 1).round().astype(int)
    ys = np.linspace(y0, y1, steps + 1).round().astype(int)
    keep = (xs >= 0) & (xs < image.shape[1]) & (ys >= 0) & (ys < image.shape[0])
    for dx in (0, 1):
        image[ys[keep], np.minimum(xs[keep] + dx, image.shape[1] - 1)] = color


def line_chart(path, series, xlabel, ylabel, ymax=None, size=(640, 400)):
    """`series`: list of (xs, ys, rgb). Writes a PNG to `path`."""
    width, height = size
    left, right, top, bottom = 70, 20, 20, 50
    image = np.full((height, width, 3), 255, np.uint8)
    xs_all = np.concatenate([np.asarray(s[0], float) for s in series] or [[1]])
    ys_all = np.concatenate([np.asarray(s[1], float) for s in series] or [[1]])
    xmax = max(float(xs_all.max()) if xs_all.size else 1.0, 1e-9)
    xmax = _nice_ceiling(xmax)
    ymax = ymax or max(float(ys_all.max()) if ys_all.size else 1.0, 1e-9)
    px = lambda x: left + (width - left - right) * x / xmax
    py = lambda y: height - bottom - (height - top - bottom) * y / ymax
    gray, black = (200, 200, 200), (0, 0, 0)
    for i in range(6):
        y = ymax * i / 5
        _line(image, px(0), py(y), px(xmax), py(y), gray)
        _text(image, 4, int(py(y)) - 5, f'{y:g}', black)
        x = xmax * i / 5
        _line(image, px(x), py(0), px(x), py(ymax), gray)
        _text(image, int(px(x)) - 10, height - bottom + 8, f'{x:g}', black)
    _line(image, px(0), py(0), px(xmax), py(0), black)
    _line(image, px(0), py(0), px(0), py(ymax), black)
    _text(image, width // 2 - 40, height - 20, xlabel, black)
    _text(image, 4, 2, ylabel, black)
    for xs, ys, color in series:
        points = [(px(x), py(y)) for x, y in zip(xs, ys)]
        for (x0, y0), (x1, y1) in zip(points, points[1:]):
            _line(image, x0, y0, x1, y1, color)
    _write_png(path, image)


def _nice_ceiling(value):
    """The smallest round number, divisible into 5 round ticks, that is at
    least `value`."""
    power = 10 ** np.floor(np.log10(value / 5))
    for mult in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if 5 * mult * power >= value:
            return 5 * mult * power
    return value


def _write_png(path, image):
    height, width, _ = image.shape
    raw = b''.join(b'\x00' + image[y].tobytes() for y in range(height))

    def chunk(kind, data):
        body = kind + data
        return struct.pack('>I', len(data)) + body + struct.pack(
            '>I', zlib.crc32(body) & 0xffffffff)

    header = struct.pack('>IIBBBBB', width, height, 8, 2, 0, 0, 0)
    with open(path, 'wb') as f:
        f.write(b'\x89PNG\r\n\x1a\n')
        f.write(chunk(b'IHDR', header))
        f.write(chunk(b'IDAT', zlib.compress(raw, 9)))
        f.write(chunk(b'IEND', b''))
