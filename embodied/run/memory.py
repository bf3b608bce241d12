"""Refuses, before anything is allocated, a replay that cannot fit in memory."""

import psutil

from embodied.core.replay import Replay


class ReplayTooLarge(MemoryError):
    """The configured replay capacity needs more memory than is available."""


def replay_bytes(config, spaces, mode='train'):
    """Estimated bytes of a full train or eval replay built by `make_replay`."""
    if mode == 'train':
        capacity = config.replay.size
        length = config.consec_train * config.batch_length
        workers = config.run.envs
    else:
        capacity = config.replay.size / 10
        length = config.consec_report * config.report_length
        workers = max(1, config.run.eval_envs)
    return Replay.estimate_bytes(
        spaces, int(capacity), length + config.replay_context,
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
