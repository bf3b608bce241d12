"""Command line entry point and the factories the runners receive.

    python -m embodied.main --configs debug --script train
    python -m embodied.run.parallel --script parallel --configs debug

`--configs a b` applies config blocks in order on top of `defaults`; any other
flag sets one config key (`--run.steps 1e4`); `--help` lists every key with
its default and comment (embodied/config_reference.py). The factories live in this module
(not in `__main__`) so that cloudpickle sends them to worker processes by
reference.
"""

import difflib
import importlib
import os
import sys
from functools import partial as bind

import elements
import numpy as np

import embodied
from embodied import config as configlib
from embodied import rpc
from embodied.core import diskfull
from embodied.core import linewise
from embodied.run import arguments
from embodied.run import replay_size
from embodied.run import replicas as replicaslib
from embodied.run import validation
from embodied.run import connections

SUITES = {
    'dummy': 'embodied.envs.dummy:Dummy',
    'cartpole': 'embodied.envs.cartpole:CartPole',
    'gym': 'embodied.envs.from_gym:FromGym',
    'dm': 'embodied.envs.from_dm:FromDM',
    'dmc': 'embodied.envs.dmc:DMC',
    'atari': 'embodied.envs.atari:Atari',
    'atari100k': 'embodied.envs.atari:Atari',
    'crafter': 'embodied.envs.crafter:Crafter',
}

AGENTS = {
    'testing': 'embodied.agents.testing:TestAgent',
    'dreamerv3': 'embodied.agents.dreamerv3:Agent',
}

SCRIPTS = (
    'train', 'train_eval', 'eval_only', 'parallel', 'parallel_env',
    'parallel_envs', 'parallel_replay')

REPLAY_SCRIPTS = ('train', 'train_eval', 'parallel', 'parallel_replay')

HELP = {'--help', '-h'}


class UsageError(Exception):
    """A bad command line or config value; the message says which."""


def main(argv=None):
    linewise.install()  # The launcher's threads print whole lines.
    try:
        config = parse(argv)
        if config.script in REPLAY_SCRIPTS:
            spaces = replay_spaces(config)
            replay_size.check_replay_fits(config, spaces)
            if not config.run.max_frame:
                config = config.update({
                    'run.max_frame': connections.frame_limit(config, spaces)})
    except (UsageError, replay_size.ReplayTooLarge) as e:
        print(f'error: {e}', file=sys.stderr)
        sys.exit(2)
    if config.replicas > 1 and config.script in replicaslib.SCRIPTS:
        # A parent that names a lost replica even when gloo aborts the
        # process doing the work (`run.replica_guard`).
        from embodied.run import replica_guard
        if not replica_guard.is_child():
            sys.exit(replica_guard.supervise(config, argv))
        replica_guard.child_setup()
    try:
        run(config)
    except rpc.Unreachable as e:  # A role that never came, or refused us.
        print(f'error: {e}', file=sys.stderr, flush=True)
        sys.exit(rpc.supervisor.exit_code(e))
    except validation.BadValue as e:
        # Values only checkable once JAX sees the devices (a mesh that does
        # not fit the GPUs), raised while the agent is built.
        if config.replicas > 1:
            _end_replica(e, code=2)
        print(f'error: {e}', file=sys.stderr)
        sys.exit(2)
    except Exception as e:
        full = diskfull.find(e)
        if full is not None:
            _end_disk_full(config, full)
        if config.replicas > 1:
            _end_replica(e)
        if _platform_error(e):  # jax.platform names a device JAX lacks.
            print(f'error: {e}', file=sys.stderr)
            sys.exit(2)
        raise
    if config.replicas > 1:
        from embodied.jax import distributed
        distributed.finish()


def _end_disk_full(config, error):
    """Ends a run whose write found no room (its roles have stopped) with
    one line and exit code 74."""
    from embodied.run import ending
    line = ending.disk_full_line(config, error)
    if config.replicas > 1:
        _end_replica(RuntimeError(line), code=diskfull.EXIT_IO)
    print(f'error: {line}', file=sys.stderr, flush=True)
    sys.exit(diskfull.EXIT_IO)


def _platform_error(error):
    # Looked up, not imported: importing embodied.jax imports JAX.
    runtime = sys.modules.get('embodied.jax.runtime')
    return runtime is not None and isinstance(error, runtime.PlatformError)


def _end_replica(error, code=1):
    """A replica that fails ends at once with exit code `code` and a
    message, rather than waiting in JAX's shutdown for replicas that may
    be gone."""
    from embodied.jax import distributed
    if not distributed.started():
        return
    distributed.exit_lost(error)
    if code == 1 and not isinstance(error, distributed.ReplicaError):
        import traceback
        traceback.print_exc()
    print(f'error: replica {distributed.replica()}: {error}',
          file=sys.stderr, flush=True)
    sys.stdout.flush()
    # Replica 0 serves the coordinator: leaving at once would end the
    # others (by SIGABRT) before they report their own error.
    if getattr(error, 'together', False):
        try:  # Every replica raised it; all reach this barrier.
            distributed.barrier('error-reported', timeout_ms=60_000)
        except Exception:
            pass
    elif distributed.replica() == 0:
        import time
        time.sleep(3)
    os._exit(code)


def parse(argv=None):
    """Turns the command line into a config, raising UsageError on bad input."""
    argv = sys.argv[1:] if argv is None else list(argv)
    wants_help = bool(HELP.intersection(argv))
    argv = [arg for arg in argv if arg not in HELP]
    try:
        argv, asked = replicaslib.requested(argv)
    except replicaslib.BadReplicas as e:
        raise UsageError(str(e)) from None
    try:
        blocks = configlib.load_blocks()
        parsed, other = elements.Flags(configs=['defaults']).parse_known(argv)
        config = configlib.build(parsed.configs, blocks)
    except (KeyError, TypeError, ValueError) as e:
        raise UsageError(_message(e)) from None
    if wants_help:
        _print_help(config)
    config = _parse_flags(config, other)
    _check(config)
    config = config.update(logdir=config.logdir.format(
        timestamp=elements.timestamp()))
    try:
        config, source = replicaslib.from_scheduler(
            config, os.environ, asked)
        replicaslib.check(config)
    except replicaslib.BadReplicas as e:
        raise UsageError(str(e)) from None
    if source:
        print(source, flush=True)
    return config


def _print_help(config):
    from embodied import config_reference
    try:
        print(config_reference.help_text(config), flush=True)
    except BrokenPipeError:  # `--help | head`
        sys.stdout = None
    sys.exit(0)


def _parse_flags(config, argv):
    known = set(config.flat)
    for arg in argv:
        if not arg.startswith('--'):
            continue
        name = arg[2:].split('=', 1)[0].rstrip('+')
        if name in known or elements.Config.IS_PATTERN.fullmatch(name):
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.5)
        hint = f" The closest known key is '{close[0]}'." if close else ''
        raise UsageError(f"Unknown flag '--{name}'.{hint}")
    try:
        return elements.Flags(config).parse(argv, help_exits=True)
    except (KeyError, TypeError, ValueError) as e:
        raise UsageError(_message(e)) from None


def _check(config):
    if config.script not in SCRIPTS:
        close = difflib.get_close_matches(config.script, SCRIPTS, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ''
        raise UsageError(
            f"Unknown --script '{config.script}'.{hint} "
            f"Choose one of: {', '.join(SCRIPTS)}.")
    if not config.random_agent:
        agent_path(config.agent_impl)
    suite = config.task.split('_', 1)[0]
    if suite not in SUITES or '_' not in config.task:
        raise UsageError(
            f"Unknown --task '{config.task}': expected suite_task with a suite "
            f"in {', '.join(SUITES)} (e.g. cartpole_balance, dummy_disc, "
            f"gym_CartPole-v1, atari_pong, crafter_reward, "
            f"dmc_walker_walk).")
    try:
        validation.check_config(config, replays=config.script in REPLAY_SCRIPTS)
    except validation.BadValue as e:
        raise UsageError(str(e)) from None


def _message(error):
    return error.args[0] if error.args else str(error)


def run(config):
    """Dispatches on `config.script`."""
    logdir = elements.Path(config.logdir)
    print('Logdir:', logdir)
    print('Run script:', config.script)
    if not config.script.endswith(('_env', '_envs', '_replay')):
        logdir.mkdir()
        if config.replica == 0 or config.replicas == 1:  # One writer.
            config.save(logdir / 'config.yaml')

    import portal
    portal.setup(
        errfile=config.errfile and logdir / 'error',
        clientkw=dict(logging_color='cyan'),
        serverkw=dict(logging_color='cyan'),
        initfns=[bind(_init_process, config.logger.timer)],
        ipv6=config.ipv6,
    )
    args = make_args(config)

    agent, env, stream, logger = (bind(make, config) for make in (
        make_agent, make_env, make_stream, make_logger))
    replay = bind(make_replay, config, 'replay')
    replay_eval = bind(make_replay, config, 'replay_eval', 'eval')

    if config.script == 'train':
        embodied.run.train(agent, replay, env, stream, logger, args)
    elif config.script == 'train_eval':
        embodied.run.train_eval(
            agent, replay, replay_eval, env, env, stream, logger, args)
    elif config.script == 'eval_only':
        embodied.run.eval_only(agent, env, logger, args)
    elif config.script == 'parallel':
        embodied.run.parallel.combined(
            agent, replay, replay_eval, env, env, stream, logger, args)
    elif config.script == 'parallel_env':
        is_eval = config.replica >= args.envs
        embodied.run.parallel.parallel_env(
            env, config.replica, args, is_eval)
    elif config.script == 'parallel_envs':
        embodied.run.parallel.parallel_envs(env, env, args)
    elif config.script == 'parallel_replay':
        embodied.run.parallel.parallel_replay(
            replay, replay_eval, stream, args)


def _init_process(timer_enabled):
    elements.timer.global_timer.enabled = timer_enabled


def make_args(config):
    """The slice of the config the runners see: `run` plus a few globals."""
    return arguments.from_config(config)


def replay_spaces(config):
    """The spaces of one stored step: observations, actions and the replay
    context the agent writes back (agents declare it with an optional static
    method `replay_context_spaces(obs_space, act_space, config)`)."""
    env = make_env(config, 0)
    obs_space, act_space = env.obs_space, env.act_space
    env.close()
    spaces = {**obs_space, **act_space}
    if not config.random_agent:
        ctor = _import(agent_path(config.agent_impl))
        context = getattr(ctor, 'replay_context_spaces', None)
        if context:
            spaces.update(context(obs_space, act_space, config))
    return spaces


def make_agent(config):
    if config.replicas > 1 and not config.random_agent:
        _join_replicas(config)
    env = make_env(config, 0)
    obs_space = {
        k: v for k, v in env.obs_space.items() if not k.startswith('log/')}
    act_space = {k: v for k, v in env.act_space.items() if k != 'reset'}
    env.close()
    if config.random_agent:
        return embodied.RandomAgent(obs_space, act_space)
    ctor = _import(agent_path(config.agent_impl))
    if config.agent_impl == 'testing':
        agent_config = elements.Config(
            **config.testing,
            seed=config.seed,
            batch_size=config.batch_size,
            batch_length=config.batch_length,
            replay_context=config.replay_context,
            logdir=config.logdir)
    else:
        agent_config = elements.Config(
            **config.agent,
            logdir=config.logdir,
            seed=config.seed,
            jax=config.jax,
            batch_size=config.batch_size,
            batch_length=config.batch_length,
            replay_context=config.replay_context,
            report_length=config.report_length,
            replica=config.replica,
            replicas=config.replicas,
            policy_batches=arguments.policy_calls(
                make_args(config), config.script),
            trains=config.script != 'eval_only')
    return ctor(obs_space, act_space, agent_config)


def _join_replicas(config):
    """Joins the run's replicas (JAX's distributed runtime), refuses a
    replica whose config differs from replica 0's, and checks that all see
    one logdir; in the process that builds the agent, before it is built."""
    from embodied.jax import distributed
    distributed.start(config)
    distributed.check_same_config(config)
    distributed.check_shared_logdir(config.logdir)


def make_logger(config):
    step = elements.Counter()
    logdir = config.logdir
    suite = config.task.split('_', 1)[0]
    # The step written counts the env steps of every replica; only replica
    # 0 writes metrics files. In --script train the replicas step alike; in
    # --script parallel the logger adds up the replicas' steps (RunStep).
    multiplier = config.env.get(suite, {}).get('repeat', 1)
    if config.script == 'train':
        multiplier *= config.replicas
    outputs = [elements.logger.TerminalOutput(config.logger.filter, 'Agent')]
    for output in (config.logger.outputs if config.replica == 0 else ()):
        if output == 'jsonl':
            outputs.append(embodied.outputs.JSONLOutput(
                logdir, 'metrics.jsonl'))
            outputs.append(embodied.outputs.JSONLOutput(
                logdir, 'scores.jsonl', 'episode/score'))
        elif output == 'tensorboard':
            outputs.append(embodied.outputs.TensorBoardOutput(
                logdir, config.logger.fps))
        elif output == 'wandb':
            name = '/'.join(logdir.split('/')[-4:])
            outputs.append(elements.logger.WandBOutput(name))
        elif output == 'scope':
            outputs.append(elements.logger.ScopeOutput(elements.Path(logdir)))
        else:
            raise ValueError(
                f"Unknown logger output '{output}' in logger.outputs "
                f"(known: jsonl, tensorboard, wandb, scope).")
    return elements.Logger(step, outputs, multiplier)


def make_replay(config, folder, mode='train'):
    capacity, length = replay_size.shape(config, mode)
    if config.batch_size * length > capacity:
        raise ValueError(
            f'The {mode} replay holds {int(capacity)} steps but one batch '
            f'needs batch_size * length = {config.batch_size} * {length} = '
            f'{config.batch_size * length}: raise replay.size.')
    directory = elements.Path(config.logdir) / folder
    if config.replicas > 1:
        directory /= f'{config.replica:05}'
    kwargs = dict(
        length=length, capacity=int(capacity), online=config.replay.online,
        chunksize=config.replay.chunksize, directory=directory)
    if config.replay.fracs.uniform < 1 and mode == 'train':
        recency = 1.0 / np.arange(1, capacity + 1) ** config.replay.recexp
        selectors = embodied.replay.selectors
        kwargs['selector'] = selectors.Mixture(dict(
            uniform=selectors.Uniform(),
            priority=selectors.Prioritized(**config.replay.prio),
            recency=selectors.Recency(recency),
        ), config.replay.fracs)
    return embodied.replay.Replay(**kwargs)


def make_env(config, index, **overrides):
    suite, task = config.task.split('_', 1)
    ctor = _import(SUITES[suite])
    kwargs = dict(config.env.get(suite, {}))
    kwargs.update(overrides)
    if kwargs.pop('use_seed', False):
        # Replicas step envs of their own seeds (replica 0's are those of a
        # run of one replica).
        key = (config.seed, index)
        if config.replicas > 1 and config.replica:
            key = (config.seed, config.replica, index)
        kwargs['seed'] = hash(key) % (2 ** 32 - 1)
    if kwargs.pop('use_logdir', False):
        kwargs['logdir'] = elements.Path(config.logdir) / f'env{index}'
    env = ctor(task, **kwargs)
    return wrap_env(env, config)


def wrap_env(env, config):
    for name, space in env.act_space.items():
        if not space.discrete:
            env = embodied.wrappers.NormalizeAction(env, name)
    env = embodied.wrappers.UnifyDtypes(env)
    env = embodied.wrappers.CheckSpaces(env)
    for name, space in env.act_space.items():
        if not space.discrete:
            env = embodied.wrappers.ClipAction(env, name)
    return env


def make_stream(config, replay, mode):
    # The original binds `replay.sample`; the sampler also fills a
    # shared-memory slot in place (`streams.Stateless`).
    stream = embodied.streams.Stateless(
        replay.sampler(config.batch_size, mode))
    stream = embodied.streams.Consec(
        stream,
        length=config.batch_length if mode == 'train' else config.report_length,
        consec=config.consec_train if mode == 'train' else config.consec_report,
        prefix=config.replay_context,
        strict=(mode == 'train'),
        contiguous=True)
    return stream


def agent_path(agent_impl):
    """'module:Class' of the agent: a name from AGENTS, or the user's own
    agent class given as 'package.module:Class' (e.g. a subclass of
    `embodied.jax.Agent`)."""
    if agent_impl in AGENTS:
        return AGENTS[agent_impl]
    module, _, name = agent_impl.partition(':')
    if module and name.isidentifier():
        return agent_impl
    raise UsageError(
        f"Unknown --agent_impl '{agent_impl}'. Choose one of: "
        f"{', '.join(AGENTS)}, or name your own class as module:Class.")


def _import(path):
    module, name = path.split(':')
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ImportError(f"Cannot load '{path}': {e}") from e


if __name__ == '__main__':
    main()
