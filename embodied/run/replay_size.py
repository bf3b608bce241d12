"""The size of the train and eval replays from the config: capacity and item
length in one place (`shape`), and the check that refuses, before anything
is allocated, replays that cannot fit in memory (`check_replay_fits`)."""

import psutil

from embodied.core.replay import Replay


class ReplayTooLarge(MemoryError):
    """The configured replay capacity needs more memory than is available."""


def shape(config, mode='train'):
    """(capacity in steps, item length) of the train replay (mode 'train')
    or the eval replay (any other mode): the eval replay holds a tenth of
    `replay.size` (a float, as configured), and an item is `consec` cuts of
    the batch length plus the `replay_context` steps before them."""
    if mode == 'train':
        capacity = config.replay.size
        length = config.consec_train * config.batch_length
    else:
        capacity = config.replay.size / 10
        length = config.consec_report * config.report_length
    return capacity, length + config.replay_context


def replay_bytes(config, spaces, mode='train'):
    """Estimated bytes of a full train or eval replay built by `make_replay`."""
    capacity, length = shape(config, mode)
    workers = config.run.envs if mode == 'train' else max(
        1, config.run.eval_envs)
    return Replay.estimate_bytes(
        spaces, int(capacity), length,
        chunksize=config.replay.chunksize, workers=workers)


def check_replay_fits(config, spaces, available=None):
    """Raises ReplayTooLarge when the train and eval replays together would
    not fit into the memory available now. `spaces` holds the observation,
    action and replay-context spaces of one stored step."""
    available = psutil.virtual_memory().available if available is None else (
        available)
    train = replay_bytes(config, spaces, 'train')
    evaluation = replay_bytes(config, spaces, 'eval')
    if train + evaluation <= available:
        return train + evaluation
    per_step = train / max(1, config.replay.size)
    # Leave a quarter of the memory for everything else.
    suggested = int(0.75 * available / per_step / 1.1)
    raise ReplayTooLarge(
        f'The replay cannot fit in memory: replay.size = '
        f'{config.replay.size:.3g} steps of about {_format(per_step)} each '
        f'needs {_format(train)} for the train replay and '
        f'{_format(evaluation)} for the eval replay (replay.size / 10), '
        f'together {_format(train + evaluation)}, but only '
        f'{_format(available)} of memory is available. Lower replay.size, '
        f'e.g. --replay.size {suggested:.2g}.')


def _format(nbytes):
    for unit in ('B', 'KiB', 'MiB', 'GiB', 'TiB'):
        if abs(nbytes) < 1024 or unit == 'TiB':
            return f'{nbytes:.1f} {unit}'
        nbytes /= 1024
