"""Checks config values before any worker starts.

A value that parses but cannot work (`--run.envs 0`, `--batch_size 0`, a
replay smaller than one batch, an address without a port) would otherwise
end a run later with a traceback, often after every worker was spawned, or
be accepted and do something nobody wants (`--run.save_every 0` never
saves). Three functions, each raising `BadValue` with every bad key, its
value and what is allowed:

    check_args(args)       the runner `args` (the `run` block plus the few
                           globals in `arguments.GLOBALS`); what every entry
                           point may call on the args it was given
    check_parallel(args)   what only the parallel runner needs of them
                           (the actor's batch against the envs)
    check_config(config)   a full config: the args plus the keys only
                           `embodied.main` reads (replay, logger.outputs)

`embodied.main` turns `BadValue` into its usage error (exit status 2).
"""

import importlib.util
import math
import numbers
import re

from embodied.core.errors import BadValue
from embodied.rpc import addresses
from embodied.run import replay_size
from embodied.run.parallel import roles


# key: (check, what is allowed). A clock with every 0 never fires and with a
# negative every fires on every iteration: fine for logging, not for saves.
_POSITIVE_SECONDS = 'a number of seconds > 0'
_CLOCK = 'a number of seconds > 0, or < 0 for every iteration (0 never fires)'
_RULES = {
    'steps': ('nonnegative', 'a number of env steps >= 0'),
    'duration': ('nonnegative', 'a number of seconds >= 0 (0: no limit)'),
    # A negative ratio is the original's "no limit"; 0 is refused because
    # the original reads it as no limit in `parallel` but as never training
    # in `train` (docs/compatibility.md).
    'train_ratio': ('nonzero_finite', (
        'a number > 0 of replayed steps per env step, or < 0 for no limit '
        '(parallel: the learner trains as fast as it can; train and '
        'train_eval: one batch per env step)')),
    'log_every': ('nonzero', _CLOCK),
    'report_every': ('nonzero', _CLOCK),
    'save_every': ('positive', _POSITIVE_SECONDS),
    'envs': ('positive_int', 'an integer >= 1'),
    'eval_envs': ('nonnegative_int', 'an integer >= 0'),
    'eval_eps': ('nonnegative_int', 'an integer >= 0'),
    'report_batches': ('positive_int', 'an integer >= 1'),
    'episode_timeout': ('positive', _POSITIVE_SECONDS),
    'actor_threads': ('positive_int', 'an integer >= 1'),
    'envs_per_worker': ('positive_int', 'an integer >= 1'),
    'env_restarts': ('nonnegative_int', 'an integer >= 0'),
    'wait_report': ('positive', _POSITIVE_SECONDS),
    'connect_timeout': ('positive', _POSITIVE_SECONDS),
    'actor_flush': ('nonnegative', 'a number of seconds >= 0'),
    'save_keep': ('positive_int', 'an integer >= 1'),
    'drain_timeout': ('positive', _POSITIVE_SECONDS),
    'eval_video': ('nonnegative_int', 'an integer >= 0'),
    'max_frame': ('nonnegative_int', 'a number of bytes >= 0 (0: derived)'),
    'batch_size': ('positive_int', 'an integer >= 1'),
    'batch_length': ('positive_int', 'an integer >= 1'),
    'report_length': ('positive_int', 'an integer >= 1'),
    'consec_train': ('positive_int', 'an integer >= 1'),
    'consec_report': ('positive_int', 'an integer >= 1'),
    'replay_context': ('nonnegative_int', 'an integer >= 0'),
    'replicas': ('positive_int', 'an integer >= 1'),
    'replica': ('nonnegative_int', 'an integer >= 0'),
    'policy_worker': ('policy_worker', 'auto, thread or process'),
    'policy_sync_every': ('positive_int', 'an integer >= 1 of updates'),
    'policy_memory': ('fraction', 'a fraction of GPU memory > 0 and <= 1'),
    'agent_memory': ('fraction', 'a fraction of GPU memory > 0 and <= 1'),
}

_CHECKS = {
    'positive': lambda x: _number(x) and x > 0,
    'nonzero': lambda x: _number(x) and x != 0,
    'nonzero_finite': lambda x: _number(x) and x != 0 and math.isfinite(x),
    'nonnegative': lambda x: _number(x) and x >= 0,
    'positive_int': lambda x: _integer(x) and x >= 1,
    'nonnegative_int': lambda x: _integer(x) and x >= 0,
    'fraction': lambda x: _number(x) and 0 < x <= 1,
    'policy_worker': lambda x: x in ('auto', 'thread', 'process'),
}



def check_args(args):
    """Raises `BadValue` naming every runner arg (a key of the `run` block
    or of `arguments.GLOBALS`) whose value cannot work. Keys that `args`
    lacks are not checked (their defaults are fine)."""
    problems = []
    prefix = lambda key: key if key in _GLOBALS else f'run.{key}'
    for key, (check, allowed) in _RULES.items():
        if key in args and not _CHECKS[check](args[key]):
            problems.append(_problem(prefix(key), args[key], allowed))
    if 'actor_batch' in args:
        batch = args['actor_batch']
        if not _integer(batch) or batch == 0 or batch < -1:
            problems.append(_problem(
                'run.actor_batch', batch,
                'an integer >= 1, or -1 for half of run.envs'))
    for key in roles.ADDR_KEYS:
        if key in args:
            problem = _address_problem(args[key])
            if problem:
                problems.append(_problem(f'run.{key}', args[key], problem))
    regex = args.get('from_checkpoint_regex') if hasattr(args, 'get') else None
    if regex:
        try:
            re.compile(regex)
        except re.error as e:
            problems.append(_problem(
                'run.from_checkpoint_regex', regex,
                f'a regular expression ({e})'))
    if problems:
        raise BadValue(problems)


def check_parallel(args):
    """Raises `BadValue` for runner args that only the parallel launcher
    (`combined`) cannot work with."""
    batch, envs = args['actor_batch'], args['envs']
    if _integer(batch) and _integer(envs) and 1 <= envs < batch:
        raise BadValue([_problem(
            'run.actor_batch', batch,
            f'at most run.envs ({envs}) for the parallel script: a policy '
            f'batch would never fill')])


def check_config(config, replays=True):
    """Raises `BadValue` naming every value of a full config that cannot
    work: the runner args (see `check_args`, and `check_parallel` for the
    parallel script) and, with `replays` (scripts that build replays), the
    replay settings against the batches the replays must serve."""
    problems = []
    args = {**config.run, **{key: config[key] for key in _GLOBALS}}
    try:
        check_args(args)
        if config.script == 'parallel':
            check_parallel(args)
    except BadValue as e:
        problems += e.problems
    if replays:
        problems += _replay_problems(config)
    problems += _mesh_problems(config)
    problems += _logger_problems(config)
    if problems:
        raise BadValue(problems)


def _logger_problems(config):
    """Unknown names in logger.outputs, and the wandb output where its
    package is missing in a process that would write to it."""
    logger = config.get('logger')
    if not logger:
        return []
    from embodied.outputs import registry
    from embodied.run import scripts
    outputs = tuple(logger.get('outputs', ()))
    problems = [
        _problem('logger.outputs', name, f'names among {registry.NAMES}')
        for name in outputs if name not in registry.OUTPUTS]
    script = scripts.SCRIPTS.get(config.get('script'))
    if not script or not script.logs or config.get('replica', 0):
        return problems
    for name in outputs:
        output = registry.OUTPUTS.get(name)
        if output and output.package and not importlib.util.find_spec(
                output.package[0]):
            package, extra = output.package
            problems.append(_problem(
                'logger.outputs', name,
                f"the {package} package for it: pip install "
                f"'embodied[{extra}]'"))
    return problems


def _mesh_problems(config):
    """The `jax.*_mesh` keys against the devices and the batch size (see
    `embodied.jax.mesh.check_config`); default meshes on real devices need
    no check here, and importing JAX is left to the agent then."""
    jaxcfg = config.get('jax')
    if not jaxcfg or config.get('random_agent') or (
            config.get('agent_impl') == 'testing'):
        return []
    default = '-1,1,1'
    if not jaxcfg.get('mock_devices') and all(
            str(jaxcfg.get(k, default)) == default
            for k in ('train_mesh', 'policy_mesh')):
        return []
    from embodied.jax import mesh  # Imports JAX (does not start it).
    try:
        mesh.check_config(
            jaxcfg, config.batch_size, int(config.get('replicas', 1) or 1))
    except BadValue as e:
        return e.problems
    return []


def _replay_problems(config):
    problems = []
    replay = config.replay
    if not _integer(replay.chunksize) or replay.chunksize < 1:
        problems.append(_problem(
            'replay.chunksize', replay.chunksize, 'an integer >= 1'))
    fracs = dict(replay.fracs)
    if any(not _number(v) or v < 0 for v in fracs.values()) or not (
            abs(sum(fracs.values()) - 1) < 1e-6):
        problems.append(_problem(
            'replay.fracs', fracs, 'fractions >= 0 that sum to 1'))
    if not problems:
        problems += _replay_size_problems(config)
    return problems


def _replay_size_problems(config):
    """The train replay (replay.size) and the eval replay (a tenth of it)
    must each hold one batch of the sequences they are sampled in."""
    problems = []
    size = config.replay.size
    if not _number(size) or size <= 0:
        return [_problem('replay.size', size, 'a number of steps > 0')]
    for name, length, consec in (
            ('train', 'batch_length', 'consec_train'),
            ('eval', 'report_length', 'consec_report')):
        capacity, steps = replay_size.shape(config, name)
        need = config.batch_size * steps
        if capacity < need:
            problems.append(_problem(
                'replay.size', size,
                f'at least {need * (10 if name == "eval" else 1):g}: the '
                f'{name} replay holds {capacity:g} steps but one batch needs '
                f'batch_size * ({consec} * {length} + replay_context) = '
                f'{config.batch_size} * {steps} = {need} steps'
                + (' (the eval replay holds replay.size / 10)'
                   if name == 'eval' else '')))
            break
    return problems


_GLOBALS = (
    'batch_size', 'batch_length', 'report_length', 'consec_train',
    'consec_report', 'replay_context', 'replica', 'replicas')


def _problem(key, value, allowed):
    return f'{key} = {value!r} is not allowed: expected {allowed}.'


def _number(x):
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and (
        x == x)  # Not NaN.


def _integer(x):
    return _number(x) and math.isfinite(x) and float(x).is_integer()


def _address_problem(addr):
    """Why `addr` is no server address, or None."""
    text = str(addr)
    if '://' in text:
        # As the original's portal clients (which assert it); its older
        # configs had zerofun's 'tcp://host:port'.
        return ("'host:port', 'host:{auto}' or a port, without a scheme "
                "such as tcp://")
    try:
        host, port = addresses.split(text.replace('{auto}', '0'))
    except ValueError as e:
        return f"'host:port', 'host:{{auto}}' or a port ({e})"
    if not 0 <= port < 65536:
        return f"a port in 0..65535, got {port}"
    return None
