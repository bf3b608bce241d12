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

RPC methods called: actor `act` (one request per step of the worker's
envs); worker 0 of a launch also sends its env fps and timers to the
logger's `add` every run.log_every.
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
from embodied.run import reporting
from embodied.run import stopping
from embodied.run.parallel import connections

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
    envs = make_envs(connections.loads(make_env), envids)
    worker = EnvWorker(envs, envids, args, is_eval, separate)
    try:
        return worker.run()
    except (rpc.Unreachable, ActorRefused, ActorUnreachable) as e:
        if not separate:  # rpc.Unreachable (or Refused): its logger's.
            raise
        print(e, flush=True)  # A line, not a traceback: nothing failed here.
        raise SystemExit(getattr(e, 'exitcode', None) or (
            rpc.supervisor.exit_code(e))) from None
    finally:
        worker.close()


def make_envs(make_env, envids):
    """The worker's envs; those made are closed when one constructor
    fails, which `EnvInitError` names."""
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
    return envs


class EnvWorker:
    """One env worker's loop: step its envs, send their observations to the
    actor in one `act` request, apply the actions of the reply; reconnect
    with back-off when the actor is lost (new episodes then)."""

    def __init__(self, envs, envids, args, is_eval, separate):
        self.envs, self.envids, self.args = envs, envids, args
        self.separate = separate
        self.name = worker_name(envids)
        self.stack = stacker(envs)
        self.fixed = {
            'envid': np.asarray(envids, np.int32),
            'is_eval': np.full(len(envids), bool(is_eval))}
        self.fps = elements.FPS()
        self.should_log = embodied.LocalClock(args.log_every)
        self.backoff = rpc.backoff.Backoff(every=args.wait_report)
        self.waiting = (f'[{self.name}] Waiting for actions from the actor '
                        f'at {args.actor_addr}')
        self.actor = None
        self.logger = None

    def run(self):
        """Steps until the actor's stop reply; returns 0."""
        args = self.args
        self.actor = self.connect()
        if self.envids[0] == 0 and '{auto}' not in args.logger_addr:
            self.logger = connections.connect(
                args, 'logger', f'{self.name}Logger', separate=self.separate,
                maxinflight=1)
        acts = self.reset_actions()
        while True:
            with elements.timer.section('step'):
                obs = [self.step(*x) for x in zip(self.envids, self.envs, acts)]
            try:
                batch = self.stack(obs)
            except embodied.wrappers.BatchSpaceError as e:
                raise BadInput(f'Env {self.envids[e.index]}: {e}') from None
            batch.update(self.fixed)
            self.fps.step(len(self.envs))
            try:
                with elements.timer.section('request'):
                    reply = self.request(batch)
            except portal.Disconnected:
                self.reconnect()
                acts = self.reset_actions()
                continue
            if self.backoff.attempts:
                self.backoff.reset()
            if connections.STOP_KEY in reply:
                return 0
            acts = [{k: v[i] for k, v in reply.items()}
                    for i in range(len(self.envs))]
            if self.logger and self.should_log():
                self.logger.add({'fps/env': self.fps.result(),
                                 **reporting.timer_metrics('timer/env')})

    def connect(self, lost=False):
        """A client of the actor. The actor serves only once it reached the
        replay and logger, which may take run.connect_timeout itself: a
        launch's worker waits twice as long, so that the role that is
        really missing is the one named. A separate command's worker waits
        run.connect_timeout: without the actor that long, its main run has
        ended or never started."""
        args = self.args
        if self.separate:
            timeout = args.connect_timeout
        else:
            timeout = connections.connect_timeout(args, 'agent')
            timeout = timeout and 2 * timeout
        # A launch's workers wait quietly for the actor at first: the
        # launcher prints one line for all of them while the agent builds.
        try:
            return rpc.SyncClient.connect(
                args.actor_addr, self.name, timeout, connections.ipv6(args),
                report_every=(
                    args.wait_report if self.separate or lost else None),
                handshake=connections.handshake(args), backoff=self.backoff)
        except rpc.Refused as e:
            raise ActorRefused(str(e)) from None
        except rpc.Unreachable as e:
            if self.separate:
                when = 'since it was lost' if lost else 'since this start'
                e = (f'[{self.name}] No actor at {args.actor_addr} for '
                     f'{timeout} s {when} (run.connect_timeout): the main '
                     f'run has ended or never started. Exiting.')
            raise ActorUnreachable(str(e)) from None

    def reconnect(self):
        self.backoff.report('lost', (
            f'[{self.name}] Lost the actor at {self.args.actor_addr}; '
            f'reconnecting and starting new episodes.'))
        self.actor.close(1)
        self.actor = None
        self.backoff.wait()
        self.actor = self.connect(lost=True)

    def reset_actions(self):
        return [{**{k: v.sample() for k, v in env.act_space.items()},
                 'reset': True} for env in self.envs]

    def step(self, envid, env, act):
        try:
            return env.step(act)
        except embodied.wrappers.SpaceError as e:
            raise BadInput(f'Env {envid}: {e}') from None

    def request(self, batch):
        try:
            return self.actor.call(
                'act', batch, report_every=self.args.wait_report,
                report=self.waiting)
        except rpc.BadRequest as e:
            raise BadInput(f'Envs {self.envids}: {e}') from None

    def close(self):
        self.actor and self.actor.close(1)
        self.logger and self.logger.close(1)
        for env in self.envs:
            env.close()
