"""The command line: parses flags into a config and runs its script.

    python -m embodied.main --configs debug --script train
    python -m embodied.run.parallel --script parallel --configs debug

`--configs a b` applies config blocks in order on top of `defaults`; any other
flag sets one config key (`--run.steps 1e4`); `--help` lists every key with
its default and comment (embodied/config_reference.py). The factories that
build envs, agents, replays, streams and loggers are `embodied.factories`.
"""

import difflib
import os
import sys
from functools import partial as bind

import elements

from embodied import config as configlib
from embodied.config import UsageError
from embodied.factories import (  # noqa: F401 (the original's names, here)
    AGENTS, SUITES, agent_path, check_agent, env_spaces, is_own_task,
    make_agent, make_args, make_env, make_logger, make_replay, make_stream,
    replay_spaces, wrap_env)
from embodied import rpc
from embodied.core import checkpoint as cplib
from embodied.core import diskfull
from embodied.core import linewise
from embodied.envs import own
from embodied.run import replay_size
from embodied.run import replicas as replicaslib
from embodied.run import saving
from embodied.run import scripts as scriptslib
from embodied.run import validation
from embodied.run.parallel import connections

# The `--script` names (embodied/run/scripts.py holds what each runs).
SCRIPTS = scriptslib.NAMES
REPLAY_SCRIPTS = tuple(s.name for s in scriptslib.TABLE if s.replay)
# The scripts that resume from saves (their pickles are refused at the start).
READ_SAVES = tuple(s.name for s in scriptslib.TABLE if s.replay or s.logs)

HELP = {'--help', '-h'}


def main(argv=None):
    linewise.install()  # The launcher's threads print whole lines.
    try:
        config = check_start(parse(argv))
        if config.script in READ_SAVES:  # Before anything is written.
            saving.refuse_pickles(
                make_args(config), eval_only=config.script == 'eval_only')
    except (UsageError, replay_size.ReplayTooLarge, cplib.PickleSave) as e:
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
    except (validation.BadValue, UsageError) as e:
        # Values only checkable once JAX sees the devices (a mesh that does
        # not fit the GPUs), raised while the agent is built; settings only
        # an output can check (W&B without credentials).
        if config.replicas > 1:
            _end_replica(e, code=2)
        print(f'error: {e}', file=sys.stderr)
        sys.exit(2)
    except Exception as e:
        _end_if_resource_ran_out(config, e)
        if config.replicas > 1:
            _end_replica(e)
        # jax.platform names a device JAX lacks; a role's usage error.
        if _platform_error(e) or _role_usage_error(e):
            print(f'error: {e}', file=sys.stderr)
            sys.exit(2)
        raise
    if config.replicas > 1:
        from embodied.jax import distributed
        distributed.finish()


def check_start(config):
    """What every script checks before it starts anything: env 0, built
    once (`make_env` refuses spaces the runner cannot take), its spaces
    against the agent (`factories.check_agent`) and, in the scripts with a
    replay, the replay's size. Raises UsageError or ReplayTooLarge; returns
    `config` with `run.max_frame` filled in where it was 0."""
    obs_space, act_space = env_spaces(config)
    check_agent(config, obs_space, act_space)
    if config.script in REPLAY_SCRIPTS:
        spaces = replay_spaces(config, spaces=(obs_space, act_space))
        replay_size.check_replay_fits(config, spaces)
        if not config.run.max_frame:
            config = config.update({
                'run.max_frame': connections.frame_limit(config, spaces)})
    return config


def _end_if_resource_ran_out(config, error):
    """Ends a run whose write found no room (exit code 74) or whose agent
    ran out of device memory (71), its roles stopped, with one line. The
    runners end a run of one replica so themselves (`run.ending`)."""
    from embodied.core import outofmemory
    from embodied.run import ending
    full = diskfull.find(error)
    memory = outofmemory.find(error)
    if full is not None:
        line, code = ending.disk_full_line(config, full), diskfull.EXIT_IO
    elif memory is not None:
        line = ending.out_of_memory_line(make_args(config), memory)
        code = outofmemory.EXIT_CODE
    else:
        return
    if config.replicas > 1:
        _end_replica(RuntimeError(line), code=code)
    print(f'error: {line}', file=sys.stderr, flush=True)
    if memory is not None:
        # The roles are stopped and saved. After a device error, JAX's
        # native threads can abort the interpreter's teardown (SIGABRT
        # instead of the exit code), so leave without it.
        sys.stdout.flush()
        os._exit(code)
    sys.exit(code)


def _platform_error(error):
    # Looked up, not imported: importing embodied.jax imports JAX.
    runtime = sys.modules.get('embodied.jax.runtime')
    return runtime is not None and isinstance(error, runtime.PlatformError)


def _role_usage_error(error):
    """Whether a role of the parallel runner ended by a usage error (the
    logger process's W&B output without credentials)."""
    return isinstance(error, rpc.WorkerFailed) and str(
        error.error or '').startswith('UsageError:')


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


def parse(argv=None, blocks=None):
    """Turns the command line into a config, raising UsageError on bad input.
    `blocks`: the config blocks (`embodied.config.load_blocks()`), for a
    caller that parses many command lines (`embodied.sweep`)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    wants_help = bool(HELP.intersection(argv))
    argv = [arg for arg in argv if arg not in HELP]
    argv = configlib.renamed_flags(argv)
    try:
        argv, asked = replicaslib.requested(argv)
    except replicaslib.BadReplicas as e:
        raise UsageError(str(e)) from None
    try:
        blocks = blocks or configlib.load_blocks()
        parsed, other = elements.Flags(configs=['defaults']).parse_known(argv)
        config = configlib.build(parsed.configs, blocks)
    except (KeyError, TypeError, ValueError) as e:
        raise UsageError(_message(e)) from None
    config = _add_own_env_keys(config, other)
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


def _add_own_env_keys(config, argv):
    """With `--task module:attr`, the config with the `env.own` keys of
    that factory (`embodied.envs.own`), so that flags can set them."""
    try:
        task = elements.Flags(task=config.task).parse_known(argv)[0].task
    except (KeyError, TypeError, ValueError) as e:
        raise UsageError(_message(e)) from None
    if not is_own_task(task):
        return config
    return own.with_keys(config, task)


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
    if not is_own_task(config.task) and (
            suite not in SUITES or '_' not in config.task):
        raise UsageError(
            f"Unknown --task '{config.task}': expected suite_task with a suite "
            f"in {', '.join(SUITES)} (e.g. cartpole_balance, dummy_disc, "
            f"gym_CartPole-v1, atari_pong, crafter_reward, "
            f"dmc_walker_walk), your own env as module:attr (e.g. "
            f"my_envs:Corridor) or gymnasium's id from your module as "
            f"gym_module:EnvId (e.g. gym_my_envs:Corridor-v0).")
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
    if scriptslib.SCRIPTS[config.script].logs:
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

    factories = scriptslib.Factories(
        agent=agent, replay=replay, replay_eval=replay_eval, env=env,
        stream=stream, logger=logger)
    scriptslib.SCRIPTS[config.script].run(factories, args, config)


def _init_process(timer_enabled):
    elements.timer.global_timer.enabled = timer_enabled


if __name__ == '__main__':
    main()
