"""What DreamerV3 can take of an env's spaces, told without building it.

`check(obs_space, act_space, config)` (the agent's spaces and its config,
as the constructor gets them) raises `ValueError` at the first key the
agent cannot take, in one line that names the key, its space, the setting
at fault and a value that works. The run calls it at the start, on env 0's
spaces, before any worker starts (`Agent.check_spaces`, through
`embodied.factories.check_agent`); the agent's constructor calls it too,
and the encoder applies its image rule (`encoder_problem`) when built.

The rules: an observation has at most 3 dims; one of 3 dims is an image,
(height, width, channels) of uint8 (of 1 or 3 channels for the report's
open-loop videos); all images have one size, whose sides each stage of
the encoder's CNN halves, down to between 2 and 16 pixels, and each stage
of the decoder's doubles back; a discrete vector is read as class indices
from 0, one class count for all its entries (integers of more than
MAX_CLASSES classes are read as numbers); a discrete action is one of
`high` classes from 0, one count for all its entries.
"""

import math

import numpy as np

SIGNAL_KEYS = ('is_first', 'is_last', 'is_terminal', 'reward')
# Integer observations with more classes than this (counters, step numbers)
# are read as numbers: a one-hot input or categorical output of that size
# would not fit in memory.
MAX_CLASSES = 1024
# The pixels the encoder's CNN ends in, per side.
END_PIXELS = (2, 16)
# The channel counts the report's open-loop videos draw.
VIDEO_CHANNELS = (1, 3)


def check(obs_space, act_space, config):
    """Raises ValueError with one line at the first of `obs_space` and
    `act_space` that DreamerV3 with `config` (its agent config) cannot
    take."""
    inputs = {k: v for k, v in obs_space.items() if k not in SIGNAL_KEYS}
    for problem in _problems(inputs, act_space, config):
        raise ValueError(problem)


def _problems(inputs, act_space, config):
    for key in sorted(inputs):
        yield from _observation(key, inputs[key], config)
    images = {k: v for k, v in inputs.items() if len(v.shape) == 3}
    if images:
        yield from _image_sizes(images, config)
    for key in sorted(act_space):
        yield from _action(key, act_space[key])


def _observation(key, space, config):
    what = f"obs '{key}' ({space})"
    dims = len(space.shape)
    if dims > 3:
        shape = (*space.shape[:2], math.prod(space.shape[2:]))
        yield (
            f'{what} has {dims} dims; DreamerV3 takes vectors of up to 2 '
            f'dims and images of 3 (height, width, channels): give it a '
            f'shape of 3 dims, e.g. {shape}.')
    elif dims == 3 and space.dtype != np.uint8:
        yield (
            f'{what}: DreamerV3 takes an observation of 3 dims as an image '
            f'of uint8 (0 to 255), not {space.dtype}: give it as uint8, or '
            f'as a vector of shape ({math.prod(space.shape)},).')
    elif dims == 3 and config.report_openloop and (
            space.shape[-1] not in VIDEO_CHANNELS):
        yield (
            f"{what} has {space.shape[-1]} channels, and the report's "
            f'open-loop videos (agent.report_openloop True) draw images of '
            f'1 or 3: set --agent.report_openloop False, or split it into '
            f'images of 1 or 3 channels.')
    elif dims == 2 and space.dtype == np.uint8:
        yield (
            f'{what}: DreamerV3 takes uint8 arrays of 2 dims for images '
            f'without a channel axis, which it cannot encode: give it shape '
            f'({space.shape[0]}, {space.shape[1]}, 1), or another dtype for '
            f'a vector.')
    elif space.discrete:
        yield from _classes(
            what, space, 'reads a discrete observation', MAX_CLASSES,
            'and shift its values by {shift}')


def _action(key, space):
    if not space.discrete:
        return
    what = f"act '{key}' ({space})"
    info = np.iinfo(space.dtype) if space.dtype != bool else None
    if info and info.bits >= 16 and (
            np.any(space.low <= info.min) or np.any(space.high >= info.max)):
        yield (
            f'{what} has no bounds; DreamerV3 gives a discrete action as '
            f'one of its high - low classes: give it low 0 and high the '
            f'number of choices.')
        return
    yield from _classes(
        what, space, 'gives a discrete action', None,
        'and add {low} to it in the env')


def _classes(what, space, reads, limit, shift):
    """A discrete space must count its classes from 0, one count for every
    entry; one of more than `limit` classes is read as numbers instead."""
    low = np.asarray(space.low, np.int64)
    classes = (np.asarray(space.high, np.int64) - low).flatten()
    if limit is not None and classes.max() > limit:
        return
    if np.any(low != 0):
        if np.all(low == low.flat[0]):
            start = low.flat[0]
            shift = shift.format(shift=-start, low=start)
        else:
            shift = 'and shift each entry by its low'
        yield (
            f'{what} starts at {low.min()}; DreamerV3 {reads} as class '
            f'indices from 0: give it low 0 and high {classes.max()}, '
            f'{shift}.')
    elif np.any(classes != classes[0]):
        counts = ', '.join(str(c) for c in sorted(set(classes.tolist())))
        yield (
            f'{what} has entries of {counts} classes; DreamerV3 {reads} '
            f'with one class count for all its entries: give every entry '
            f'high {classes.max()}.')


def _image_sizes(images, config):
    keys = sorted(images)
    first = images[keys[0]]
    size = first.shape[:2]
    for key in keys[1:]:
        if images[key].shape[:2] != size:
            yield (
                f"obs '{key}' ({images[key]}) is "
                f'{_pixels(images[key].shape)} and obs \'{keys[0]}\' '
                f'({first}) {_pixels(size)}; DreamerV3 stacks its images, '
                f'which need one size: resize one to the other '
                f'(embodied.wrappers.ResizeImage).')
            return
    what = f"obs '{keys[0]}' ({first})"
    yield from _encoder(what, size, config)
    yield from _decoder(what, size, config.dec.simple, config.dyn.rssm)


def stages(net):
    """The halvings of the image by the CNN of `net` (its `enc.simple` or
    `dec.simple` settings): each stage but an `outer` first one."""
    return len(net.mults) - int(bool(net.outer))


def encoder_problem(size, mults, outer, where='agent.enc.simple',
                    decoder=None):
    """What is wrong with images of `size` (height, width) for an encoder
    of `mults` and `outer`, or None; the text names the settings under
    `where`. Where the stage counts it proposes do not fit the `decoder`
    (its `dec.simple` settings, if given) either, it proposes the
    decoder's too."""
    count = len(mults) - int(bool(outer))
    factor = 2 ** count
    end = tuple(s // factor for s in size)
    lo, hi = END_PIXELS
    divides = all(s % factor == 0 for s in size)
    if divides and all(lo <= e <= hi for e in end):
        return None
    fits = [
        k for k in range(1, 9) if all(
            s % 2 ** k == 0 and lo <= s // 2 ** k <= hi for s in size)]
    text = (
        f'{where}.mults {list(mults)} halves {_pixels(size)} images '
        f'{_times(count)}, ')
    if divides:
        text += (
            f'to {_pixels(end)}, and the encoder must end between {lo} and '
            f'{hi} pixels')
    else:
        text += f'which needs sides that {factor} divides'
    options = []
    if fits:
        near = min(fits, key=lambda k: abs(k - count))  # Of the fewest changes.
        flags = f'--{where}.mults {_first(mults, near + int(outer))}'
        if decoder is not None and any(
                s % 2 ** stages(decoder) for s in size):
            flags += (
                f' --agent.dec.simple.mults '
                f'{_first(decoder.mults, near + int(decoder.outer))}')
        counts = (f'{fits[0]} to {fits[-1]}' if len(fits) > 1
                  else f'{fits[0]}')
        options.append(f'set {flags} ({counts} stages fit {_pixels(size)})')
    best = tuple(
        int(np.clip(max(1, round(s / factor)), lo, hi)) * factor
        for s in size)
    options.append(
        f'give images of {lo * factor} to {hi * factor} pixels a side in '
        f'steps of {factor} (e.g. {_pixels(best)})')
    return f'{text}: {", or ".join(options)}.'


def _first(mults, length):
    """The first `length` of `mults` as a flag value, the last repeated
    where it has fewer."""
    mults = list(mults) or [1]
    return ','.join(map(str, (mults + mults[-1:] * length)[:length]))


def _encoder(what, size, config):
    net = config.enc.simple
    problem = encoder_problem(
        size, net.mults, net.outer, decoder=config.dec.simple)
    if problem:
        yield f'{what}: {problem}'


def _decoder(what, size, net, rssm):
    factor = 2 ** stages(net)
    if any(s % factor for s in size):
        fits = [k for k in range(1, 9) if all(s % 2 ** k == 0 for s in size)]
        hint = ''
        if fits:
            length = min(fits[-1], len(net.mults)) + int(bool(net.outer))
            hint = (
                f'set --agent.dec.simple.mults {_first(net.mults, length)}, '
                f'or ')
        yield (
            f'{what}: agent.dec.simple.mults {list(net.mults)} doubles the '
            f'decoder {_times(stages(net))} up to the image, which needs '
            f'sides that {factor} divides: {hint}give images whose sides '
            f'{factor} divides.')
        return
    depth = net.depth * net.mults[-1]
    if net.bspace and (rssm.deter % net.bspace or depth % net.bspace):
        yield (
            f'{what}: agent.dec.simple.bspace {net.bspace} must divide '
            f'agent.dyn.rssm.deter {rssm.deter} and the decoder\'s last '
            f'depth {depth} (dec.simple.depth x the last of '
            f'dec.simple.mults): set --agent.dec.simple.bspace '
            f'{math.gcd(rssm.deter, depth)}.')


def _times(count):
    return 'once' if count == 1 else f'{count} times'


def _pixels(shape):
    return f'{shape[0]}x{shape[1]}'
