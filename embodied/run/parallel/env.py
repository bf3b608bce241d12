"""Env worker processes of the parallel runner.

    env worker: step envs ──act(obs)──► actor ──actions──► step envs ...

Each worker steps `run.envs_per_worker` envs, sends their observations to the
actor in one request and applies the actions of the reply; a stop reply ends
it with 0. `parallel_env` and `parallel_envs` run workers apart from
`combined` (on other machines). `pool` restarts crashed workers
(`rpc.supervisor.RestartingGroup`, `run.env_restarts`), except those that
end with an error a restart cannot fix (`FATAL`: the errors below).

A worker that loses the actor reconnects with back-off (`rpc.backoff`).
Workers of a separately started command give up after run.connect_timeout
without the actor, from their start or from the loss: its main run has
ended or never started (exit 69), or the actor refused this command's
secret (exit 77); `parallel_envs` then ends with that code and one line
saying why.

RPC methods called: actor `act` (one request per step of the worker's envs).
"""

import dataclasses
import functools
import time
from collections.abc import Callable

import elements
import numpy as np
import portal

import embodied
from embodied import rpc
from embodied.rpc.supervisor import (
    EXIT_BAD_INPUT, EXIT_ENV_INIT, EXIT_REFUSED, EXIT_UNREACHABLE)
from embodied.run import arguments
from embodied.run import learning
from embodied.run import stopping
from embodied.run import connections

FATAL = (EXIT_ENV_INIT, EXIT_BAD_INPUT, EXIT_UNREACHABLE, EXIT_REFUSED)
# Exit codes of a worker that gave up on the actor, and why.
NO_ACTOR = {
    EXIT_UNREACHABLE: 'found no actor within run.connect_timeout',
    EXIT_REFUSED: ('was refused by the actor: its run secret or its '
                   'run.auth differs (see above)')}


class EnvInitError(RuntimeError):
    """An env could not be constructed."""

    exitcode = EXIT_ENV_INIT


class ActorUnreachable(ConnectionError):
    """The actor did not accept the env worker within run.connect_timeout."""

    exitcode = EXIT_UNREACHABLE


class ActorRefused(ConnectionError):
    """The actor refused the env worker's secret until run.connect_timeout."""

    exitcode = EXIT_REFUSED


class BadInput(ValueError):
    """An observation or action that does not match its space."""

    exitcode = EXIT_BAD_INPUT


@dataclasses.dataclass
class EnvWorkerSpec:
    """A worker's name, the env ids it steps, and a factory of a fresh,
    unstarted `rpc.Process` that runs it."""

    name: str
    envids: list
    is_eval: bool
    make: Callable


def pool(specs, args, on_crash=None):
    """The env workers of `specs`, restarted when they crash."""
    return rpc.supervisor.RestartingGroup(
        specs, args.env_restarts, on_crash, fatal=FATAL,
        setting='run.env_restarts')


@elements.timer.section('env')
def parallel_env(make_env, envid, args, is_eval=False):
    """One env worker stepping one env; see `parallel_envs` for more."""
    return run_worker(make_env, [envid], args, is_eval, separate=True)


def parallel_envs(make_env, make_env_eval, args):
    """Runs all env workers of `args` (`run.envs_per_worker` envs each) until
    the actor tells them to stop, restarting crashed ones like `combined`
    does; for envs launched apart from `combined`."""
    args = arguments.normalize(args)
    workers = pool(specs(
        connections.dumps(make_env), connections.dumps(make_env_eval), args,
        separate=True), args)
    workers.start()
    with stopping.StopSignal() as stop:
        try:
            while not stop.requested:
                try:
                    workers.poll(done_ok=True)
                except rpc.WorkerFailed as e:
                    if e.exitcode not in NO_ACTOR:
                        raise
                    # The worker printed why; one line for the command.
                    print(f'parallel_envs: ending with exit code '
                          f'{e.exitcode}: {e.name} '
                          f'{NO_ACTOR[e.exitcode]}.', flush=True)
                    raise SystemExit(e.exitcode) from None
                if not workers.running() and not workers.restarting():
                    break  # Every worker was told to stop.
                time.sleep(0.1)
        finally:
            workers.kill()
    return 0


def specs(make_env_train, make_env_eval, args, separate=False):
    """An `EnvWorkerSpec` per env worker process of the launch; with
    `separate`, of a command started apart from the main run."""
    size = max(1, args.envs_per_worker)
    train = list(range(args.envs))
    evals = list(range(args.envs, args.envs + args.eval_envs))
    result = []
    for envids, make, is_eval in (
            (train, make_env_train, False), (evals, make_env_eval, True)):
        for i in range(0, len(envids), size):
            ids = envids[i:i + size]
            name = worker_name(ids)
            result.append(EnvWorkerSpec(
                name, ids, is_eval, functools.partial(
                    rpc.Process, run_worker, make, ids, args, is_eval,
                    separate, name=name)))
    return result


def worker_name(envids):
    """`Env00003`, or `Env00002-00003` for a worker of several envs."""
    return f'Env{envids[0]:05}' + (
        f'-{envids[-1]:05}' if len(envids) > 1 else '')


def stacker(envs):
    """`stack(obs)` for the obs of `envs`, stacked per key and checked once
    per worker step instead of once per env where the envs share their
    spaces (`wrappers.shared_check`)."""
    check = embodied.wrappers.shared_check(envs)

    def stack(obs):
        try:  # np.array stacks like np.stack, at a fraction of its overhead.
            batch = {k: np.array([o[k] for o in obs]) for k in obs[0]}
        except Exception:
            batch = None  # Named by the check, or raised by np.stack.
        if check:
            check.check_stacked(obs, batch)
        return batch or {k: np.stack([o[k] for o in obs]) for k in obs[0]}
    return stack


def run_worker(make_env, envids, args, is_eval, separate=False):
    """Steps the envs `envids` against the actor until it says stop. With
    `separate` (a command started apart from the main run), it gives up
    after run.connect_timeout without the actor."""
    args = arguments.normalize(args)
    make_env = connections.loads(make_env)
    name = worker_name(envids)
    envs = []
    try:
        for envid in envids:
            envs.append(make_env(envid))
    except Exception as e:
        for env in envs:
            env.close()
        raise EnvInitError(
            f'Env {envid} failed in its constructor: '
            f'{type(e).__name__}: {e}') from e
    stack = stacker(envs)
    fixed = {
        'envid': np.asarray(envids, np.int32),
        'is_eval': np.full(len(envids), bool(is_eval))}
    fps = elements.FPS()
    should_log = embodied.LocalClock(args.log_every)
    logger = None
    backoff = rpc.backoff.Backoff(every=args.wait_report)

    def connect(lost=False):
        # The actor serves only once it reached the replay and logger, which
        # may take run.connect_timeout itself: a launch's worker waits twice
        # as long, so that the role that is really missing is the one named.
        # A separate command's worker waits run.connect_timeout: without
        # the actor that long, its main run has ended or never started.
        if separate:
            timeout = args.connect_timeout
        else:
            timeout = connections.connect_timeout(args, 'actor')
            timeout = timeout and 2 * timeout
        # A launch's workers wait quietly for the actor at first: the
        # launcher prints one line for all of them while the agent builds.
        try:
            return rpc.SyncClient.connect(
                args.actor_addr, name, timeout, connections.ipv6(args),
                report_every=args.wait_report if separate or lost else None,
                handshake=connections.handshake(args), backoff=backoff)
        except rpc.Refused as e:
            raise ActorRefused(str(e)) from None
        except rpc.Unreachable as e:
            if separate:
                when = 'since it was lost' if lost else 'since this start'
                e = (f'[{name}] No actor at {args.actor_addr} for {timeout} s '
                     f'{when} (run.connect_timeout): the main run has ended '
                     f'or never started. Exiting.')
            raise ActorUnreachable(str(e)) from None

    def reset_actions():
        return [{**{k: v.sample() for k, v in env.act_space.items()},
                 'reset': True} for env in envs]

    def step(envid, env, act):
        try:
            return env.step(act)
        except embodied.wrappers.SpaceError as e:
            raise BadInput(f'Env {envid}: {e}') from None

    waiting = (f'[{name}] Waiting for actions from the actor at '
               f'{args.actor_addr}')

    def request(batch):
        try:
            return actor.call(
                'act', batch, report_every=args.wait_report, report=waiting)
        except rpc.BadRequest as e:
            raise BadInput(f'Envs {envids}: {e}') from None

    actor = None
    try:
        actor = connect()
        if envids[0] == 0 and '{auto}' not in args.logger_addr:
            logger = connections.connect(
                args, 'logger', f'{name}Logger', separate=separate,
                maxinflight=1)
        acts = reset_actions()
        while True:
            with elements.timer.section('step'):
                obs = [step(*x) for x in zip(envids, envs, acts)]
            try:
                batch = stack(obs)
            except embodied.wrappers.BatchSpaceError as e:
                raise BadInput(f'Env {envids[e.index]}: {e}') from None
            batch.update(fixed)
            fps.step(len(envs))
            try:
                with elements.timer.section('request'):
                    reply = request(batch)
            except portal.Disconnected:
                backoff.report('lost', (
                    f'[{name}] Lost the actor at {args.actor_addr}; '
                    f'reconnecting and starting new episodes.'))
                actor.close(1)
                actor = None
                backoff.wait()
                actor = connect(lost=True)
                acts = reset_actions()
                continue
            if backoff.attempts:
                backoff.reset()
            if connections.STOP_KEY in reply:
                return 0
            acts = [{k: v[i] for k, v in reply.items()}
                    for i in range(len(envs))]
            if logger and should_log():
                logger.add({'fps/env': fps.result(),
                            **learning.timer_metrics('timer/env')})
    except (rpc.Unreachable, ActorRefused, ActorUnreachable) as e:
        if not separate:  # rpc.Unreachable (or Refused): its logger's.
            raise
        print(e, flush=True)  # A line, not a traceback: nothing failed here.
        raise SystemExit(getattr(e, 'exitcode', None) or (
            rpc.supervisor.exit_code(e))) from None
    finally:
        actor and actor.close(1)
        logger and logger.close(1)
        for env in envs:
            env.close()
