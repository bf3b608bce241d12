"""The `args` every runner receives: the `run` config block plus a few globals.

The original's main.py builds `args` from its own `run` block, which lacks
the keys this package adds (`run.from_checkpoint_regex`, `run.envs_per_worker`,
`run.connect_timeout`, ...), and holds values that stand for others
(`actor_batch: -1`). Every runner entry point passes its `args` through
`normalize`, so an `args` built the original's way works unchanged, whichever
entry point it reaches first: what it lacks comes from the `defaults` block of
`configs/defaults.yaml`, what it holds is kept, and stand-in values are
resolved.
"""

import functools
import glob
import importlib.util
import os

import elements

from embodied import config as configlib
from embodied.run import validation

# Top-level config keys that `args` carries next to the `run` block; the
# original passes all of them except `seed`. `logdir` has no default.
GLOBALS = (
    'replica', 'replicas', 'logdir', 'seed', 'batch_size', 'batch_length',
    'report_length', 'consec_train', 'consec_report', 'replay_context')


def from_config(config):
    """The `args` for the runners from a full config; `run.policy_worker
    auto` resolved for `jax.platform`."""
    args = elements.Config(
        **config.run, **{key: config[key] for key in GLOBALS},
        coordinator_address=config.jax.coordinator_address)
    return args.update(policy_worker=policy_worker(
        args, config.jax.platform))


def normalize(args):
    """`args` as every runner reads them: `with_defaults`, checked by
    `validation.check_args` (a bad value raises `validation.BadValue`
    naming the key), then the values that stand for others resolved
    (`actor_batch` <= 0 becomes half the envs, at least 1, as in the
    original). Idempotent, so each entry point may call it on what another
    already normalized."""
    args = with_defaults(args)
    validation.check_args(args)
    if args.actor_batch <= 0:
        args = args.update(actor_batch=max(1, args.envs // 2))
    if args.policy_worker == 'auto':
        args = args.update(policy_worker=policy_worker(args))
    return args


# The packages of JAX's NVIDIA GPU backend.
CUDA_PLUGINS = ('jax_cuda12_plugin', 'jax_cuda13_plugin')


def policy_worker(args, platform='auto'):
    """`run.policy_worker` with `auto` resolved: 'process' where JAX
    runs on an NVIDIA GPU (one policy process per replica), else
    'thread'. For
    `jax.platform` auto, a GPU counts when a CUDA backend of JAX is
    installed and a device node of the NVIDIA driver exists (nothing
    starts JAX here)."""
    value = args.get('policy_worker', 'auto')
    if value != 'auto':
        return value
    if platform in ('cpu', 'tpu'):
        return 'thread'
    if platform == 'auto':
        chosen = os.environ.get('JAX_PLATFORMS', '')
        if chosen and not {'cuda', 'gpu'} & set(chosen.split(',')):
            return 'thread'
        if not (glob.glob('/dev/nvidia[0-9]*') and any(
                importlib.util.find_spec(name) for name in CUDA_PLUGINS)):
            return 'thread'
    return 'process'


def policy_calls(args, script):
    """{policy mode: batch sizes} the runner of `script` calls the policy
    with, for an agent to compile ahead: the actor's `actor_batch` in
    `parallel`, the driver's env counts in the single-process scripts."""
    args = normalize(args)
    if script == 'parallel':
        return {'train': [args.actor_batch]}
    if script == 'train':
        return {'train': [args.envs]}
    if script == 'eval_only':
        return {'eval': [args.envs]}
    if script == 'train_eval':
        return {'train': [args.envs], 'eval': [max(1, args.eval_envs)]}
    return {}


class Complete(elements.Config):
    """An `args` that holds every key of `defaults()`, as `with_defaults`
    returns it. It stays one through `update` and pickling (which cannot
    remove keys), so the processes of a run, each calling `normalize` on
    what the launcher normalized, need not read the config files again."""


def with_defaults(args):
    """`args` (an `elements.Config` or mapping) with every key a runner reads
    and `args` lacks set to its default; nested keys such as `usage.gc` are
    filled one by one. Keys already present are kept as given."""
    if isinstance(args, Complete):
        return args
    args = args if isinstance(args, elements.Config) else elements.Config(args)
    given = args.flat
    missing = {k: v for k, v in defaults().items() if k not in given}
    return Complete({**given, **missing})


@functools.cache
def _defaults():
    config = configlib.build([])
    flat = dict(config.run.flat)
    flat.update({k: config[k] for k in GLOBALS if k != 'logdir'})
    # Replica 0's coordinator (JAX's): the launcher's `{auto}` ports avoid it.
    flat['coordinator_address'] = config.jax.coordinator_address
    return tuple(flat.items())


def defaults():
    """{flat key: default} of every `args` key that has a default."""
    return dict(_defaults())
