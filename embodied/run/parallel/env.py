"""Env worker processes of the parallel runner.

    env worker: step envs ──act(obs)──► actor ──actions──► step envs ...

Each worker steps `run.envs_per_worker` envs, sends their observations to the
actor in one request and applies the actions of the reply; a stop reply ends
it with 0. `parallel_env` and `parallel_envs` run workers apart from
`combined` (on other machines); `specs` describes the workers of a launch for
`envpool.EnvPool`, which restarts crashed ones. Errors a restart cannot fix
end the worker with an exit code that says so (see `envpool`).

RPC methods called: actor `act` (one request per step of the worker's envs).
"""

import functools
import time

import elements
import numpy as np
import portal

import embodied
from embodied import rpc
from embodied.run.parallel import envpool
from embodied.run import arguments
from embodied.run import stopping
from embodied.run import timing
from embodied.run import wiring


@elements.timer.section('env')
def parallel_env(make_env, envid, args, is_eval=False):
    """One env worker stepping one env; see `parallel_envs` for more."""
    return run_worker(make_env, [envid], args, is_eval)


def parallel_envs(make_env, make_env_eval, args):
    """Runs all env workers of `args` (`run.envs_per_worker` envs each) until
    the actor tells them to stop, restarting crashed ones like `combined`
    does; for envs launched apart from `combined`."""
    args = arguments.normalize(args)
    pool = envpool.EnvPool(
        specs(wiring.dumps(make_env), wiring.dumps(make_env_eval), args),
        args.env_restarts)
    pool.start()
    with stopping.StopSignal() as stop:
        try:
            while not stop.requested:
                pool.poll(done_ok=True)
                if not pool.running() and not pool.restarting():
                    break  # Every worker was told to stop.
                time.sleep(0.1)
        finally:
            pool.kill()
    return 0


def specs(make_env_train, make_env_eval, args):
    """An `EnvWorkerSpec` per env worker process of the launch."""
    size = max(1, args.envs_per_worker)
    train = list(range(args.envs))
    evals = list(range(args.envs, args.envs + args.eval_envs))
    result = []
    for envids, make, is_eval in (
            (train, make_env_train, False), (evals, make_env_eval, True)):
        for i in range(0, len(envids), size):
            ids = envids[i:i + size]
            name = worker_name(ids)
            result.append(envpool.EnvWorkerSpec(
                name, ids, is_eval, functools.partial(
                    rpc.Process, run_worker, make, ids, args, is_eval,
                    name=name)))
    return result


def worker_name(envids):
    """`Env00003`, or `Env00002-00003` for a worker of several envs."""
    return f'Env{envids[0]:05}' + (
        f'-{envids[-1]:05}' if len(envids) > 1 else '')


def run_worker(make_env, envids, args, is_eval):
    """Steps the envs `envids` against the actor until it says stop."""
    args = arguments.normalize(args)
    make_env = wiring.loads(make_env)
    name = worker_name(envids)
    envs = []
    try:
        for envid in envids:
            envs.append(make_env(envid))
    except Exception as e:
        for env in envs:
            env.close()
        raise envpool.EnvInitError(
            f'Env {envid} failed in its constructor: '
            f'{type(e).__name__}: {e}') from e
    fixed = {
        'envid': np.asarray(envids, np.int32),
        'is_eval': np.full(len(envids), bool(is_eval))}
    fps = elements.FPS()
    should_log = embodied.LocalClock(args.log_every)
    logger = None
    if envids[0] == 0 and '{auto}' not in args.logger_addr:
        logger = wiring.connect(args, 'logger', f'{name}Logger', maxinflight=1)

    def connect():
        # The actor serves only once it reached the replay and logger, which
        # may take run.connect_timeout itself: wait twice as long, so that
        # the role that is really missing is the one named.
        timeout = wiring.connect_timeout(args, 'actor')
        try:
            return rpc.SyncClient.connect(
                args.actor_addr, name, timeout and 2 * timeout,
                wiring.ipv6(args), report_every=args.wait_report,
                handshake=wiring.handshake(args))
        except rpc.Unreachable as e:
            raise envpool.ActorUnreachable(str(e)) from None

    def reset_actions():
        acts = []
        for env in envs:
            act = {k: v.sample() for k, v in env.act_space.items()}
            act['reset'] = True
            acts.append(act)
        return acts

    def step(envid, env, act):
        try:
            return env.step(act)
        except embodied.wrappers.SpaceError as e:
            raise envpool.BadInput(f'Env {envid}: {e}') from None

    def request(batch):
        try:
            return actor.call(
                'act', batch, report_every=args.wait_report, report=(
                    f'[{name}] Waiting for actions from the actor at '
                    f'{args.actor_addr}'))
        except rpc.BadRequest as e:
            raise envpool.BadInput(f'Envs {envids}: {e}') from None

    actor = None
    try:
        actor = connect()
        acts = reset_actions()
        while True:
            with elements.timer.section('step'):
                obs = [step(*x) for x in zip(envids, envs, acts)]
            batch = {k: np.stack([o[k] for o in obs]) for k in obs[0]}
            batch.update(fixed)
            fps.step(len(envs))
            try:
                with elements.timer.section('request'):
                    reply = request(batch)
            except portal.Disconnected:
                print(f'[{name}] Lost the actor; reconnecting and starting '
                      f'new episodes.', flush=True)
                actor.close(1)
                actor = None
                actor = connect()
                acts = reset_actions()
                continue
            if wiring.STOP_KEY in reply:
                return 0
            acts = [{k: v[i] for k, v in reply.items()}
                    for i in range(len(envs))]
            if logger and should_log():
                logger.add({'fps/env': fps.result(),
                            **timing.timer_metrics('timer/env')})
    finally:
        actor and actor.close(1)
        logger and logger.close(1)
        for env in envs:
            env.close()
