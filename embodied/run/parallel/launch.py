"""The launcher: `combined` starts every role and alone decides stop and save.

    combined(make_agent, make_replay_train, make_replay_eval, make_env_train,
             make_env_eval, make_stream, make_logger, args):
        start workers: Agent (actor + learner), Logger, Replay, env workers
        connect to logger, replay, actor
        first save (a fresh run), then until run.steps / run.duration / a signal:
            read the logger's step; every run.save_every: save; print progress
        stop: drain, stop the learner, release the replay, final save,
              stop the envs, shut the roles down; every worker exits 0

Saves and the stop follow `save_and_stop.py`. Crashed env workers restart
(`env.pool`); an env error a restart cannot fix stops the run in order with
a save, then raises `rpc.WorkerFailed` naming the worker. With run.auth the
launcher hands its workers the data token only and alone holds the control
token (`rpc.auth`, `remote_roles.credentials`). SIGTERM to any process of
the run asks for a stop with a final save (workers ignore it and SIGINT).

RPC methods called here: actor `status`; replay `status`, `shutdown`;
logger `status`, `abandon`; and those of `save_and_stop.py`.
"""

import multiprocessing
import sys
import time

import embodied
from embodied import rpc
from embodied.core import diskfull
from embodied.run import arguments
from embodied.run import ending
from embodied.run import progress
from embodied.run import saving
from embodied.run import stopping
from embodied.run import validation
from embodied.run import connections
from embodied.run.parallel import env
from embodied.run.parallel import remote_roles
from embodied.run.parallel import save_and_stop
from embodied.run.parallel.agent_process import parallel_agent
from embodied.run.parallel.logger_server import parallel_logger
from embodied.run.parallel.replay_server import parallel_replay

ADDR_KEYS = ('actor_addr', 'replay_addr', 'logger_addr')
PORT_ATTEMPTS = 3


@ending.in_one_line
def combined(
        make_agent, make_replay_train, make_replay_eval, make_env_train,
        make_env_eval, make_stream, make_logger, args):
    """Runs the whole training launch until it stops; see the module doc.
    Workers are spawned and import the calling script again, so a script
    calls `combined` under `if __name__ == '__main__':` (without the guard,
    the workers end at once with an error saying so)."""
    _refuse_in_spawned_worker()
    args = arguments.normalize(args)
    validation.check_parallel(args)
    factories = dict(
        agent=make_agent, replay_train=make_replay_train,
        replay_eval=make_replay_eval, env_train=make_env_train,
        env_eval=make_env_eval, stream=make_stream, logger=make_logger)
    factories = {k: connections.dumps(v) for k, v in factories.items()}
    origin = remote_roles.secret_origin(args)
    creds = remote_roles.credentials(args, origin)
    for line in remote_roles.start_lines(args, origin):
        print(line, flush=True)
    if creds:  # The workers get the data token, never the control token.
        args = args.update(secret=creds.for_workers().encode())
    if args.get('from_checkpoint') and saving.resume_tag(args.logdir, report=False) is None:
        saving.agent_save_folder(args.from_checkpoint)
    auto = any('{auto}' in str(args[k]) for k in ADDR_KEYS)
    for attempt in range(PORT_ATTEMPTS):
        filled = rpc.addresses.fill_auto(
            {k: args[k] for k in ADDR_KEYS}, connections.ipv6(args),
            avoid=_coordinator_port(args))
        launch = _Launch(
            factories, args.update(filled),
            handshake=creds and creds.handshake(control=True),
            secret_origin=origin)
        try:
            return launch.run()
        except rpc.WorkerFailed as e:
            if not auto or e.exitcode != rpc.supervisor.EXIT_PORT_TAKEN:
                raise
            if attempt + 1 == PORT_ATTEMPTS:
                raise
            print(f'{e} Retrying with other ports.', flush=True)


def _coordinator_port(args):
    """The port of JAX's coordinator when this launch's agent may serve it
    (replica 0 binds it only once the agent is being built, after the
    launcher chose its `{auto}` ports): a port taken by both would end
    every replica."""
    address = args.get('coordinator_address')
    if args.replicas <= 1 or not address:
        return ()
    try:
        return (rpc.addresses.split(address)[1],)
    except ValueError:
        return ()  # The agent names the bad address when it joins.


def _refuse_in_spawned_worker():
    # True while a spawned child imports its parent's script (the flag that
    # multiprocessing's own bootstrapping check reads).
    if getattr(multiprocessing.current_process(), '_inheriting', False):
        main = sys.modules.get('__mp_main__')
        raise RuntimeError(
            f"combined() was called while a worker process was starting: "
            f"the script {getattr(main, '__file__', '')} calls it at import "
            f"time. Workers are spawned and import the script again, so "
            f"call combined() under `if __name__ == '__main__':`.")


class _Launch(save_and_stop.SaveAndStop):
    """The workers of one `combined` launch and the decisions about them:
    the agent, logger and replay in `group`, whose end ends the run (the
    roles still alive save first, `_salvage`); env workers in `envs`."""

    def __init__(self, factories, args, handshake=None, secret_origin=None):
        self.args = args
        self.secret_origin = secret_origin  # See `remote_roles.secret_origin`.
        self.handshake = handshake  # The control token's, with run.auth.
        self.group = rpc.Supervisor()
        f = factories
        agent_cls = rpc.Process if args.agent_process else rpc.Thread
        self.group.add(agent_cls(parallel_agent, f['agent'], args, name='Agent'))
        self.group.add(rpc.Process(
            parallel_logger, f['logger'], args, name='Logger'))
        if not args.remote_replay:
            self.group.add(rpc.Process(
                parallel_replay, f['replay_train'], f['replay_eval'],
                f['stream'], args, name='Replay'))
        specs = []
        if not args.remote_envs:
            specs = env.specs(f['env_train'], f['env_eval'], args)
        self.envs = env.pool(specs, args, on_crash=self._env_crashed)
        self.clients = {}
        self.may_exit = ()  # Workers that may end with 0 (while stopping).
        self.progress = progress.Progress(args)
        self.step = 0  # The logger's step when last asked.
        self.saved = 0  # The newest save tag the learners asked for.

    def run(self):
        args = self.args
        start = time.monotonic()
        print(f'Launching {len(self.group.workers) + len(self.envs.slots)} '
              f'workers: actor at {args.actor_addr}, replay at '
              f'{args.replay_addr}, logger at {args.logger_addr}.', flush=True)
        try:
            with stopping.StopSignal() as signal:
                self.group.start()
                self.envs.start()
                self._print_workers()
                try:
                    self._connect()
                    reason = self._loop(start, signal)
                except Exception as e:
                    self._fail(e)
                    raise
                try:
                    self._stop(reason)
                except Exception as e:
                    if diskfull.find(e) is not None:
                        self._end_unsaved()
                    raise
        except BaseException:
            self.envs.kill()
            self.group.kill()
            self._shutdown_remote()
            raise
        finally:
            for client in self.clients.values():
                client.close(1)

    def _print_workers(self):
        parts = [f'{w.name} (pid {w.pid})' if getattr(w, 'pid', None) else
                 f'{w.name} (thread)'
                 for w in self.group.workers + self.envs.workers]
        print(f'Workers: {", ".join(parts)}.', flush=True)

    def _check(self):
        """Raises `WorkerFailed` for a worker that ends the run; restarts
        crashed env workers."""
        self.group.check(self.may_exit)
        self.envs.poll()

    def _env_crashed(self, spec, exitcode, error):
        client = self.clients.get('logger')
        if client is not None:
            self._try(lambda: client.call('abandon', list(spec.envids)).result(
                timeout=10), f'Could not tell the logger to drop the episodes '
                f'of {spec.name}')

    def _shutdown_remote(self):
        """Best effort: tells a separately launched replay to exit too."""
        if self.args.remote_replay:
            self._try_call('replay', 'shutdown', timeout=2)

    def _connect(self, limit=None):
        """Connects to every role. A remote role not up within
        run.connect_timeout ends the run naming its address; a role this
        launch started has no limit (`_check` ends the run if it dies), so
        a busy machine or a long compile is no error. With `limit` (after
        a failure, to save): the roles not yet connected, each within
        `limit` seconds, without `_check`."""
        for role in ('logger', 'replay', 'actor'):
            if role in self.clients:
                continue
            timeout = limit or connections.connect_timeout(self.args, role)
            addr = self.args[f'{role}_addr']
            report = None
            if role == 'actor' and not limit and timeout is None:
                report = self._actor_wait_line(addr)
            try:
                self.clients[role] = rpc.connect(
                    addr, f'Launcher{role.title()}', timeout,
                    connections.ipv6(self.args), self.args.wait_report,
                    check=None if limit else self._check,
                    handshake=self.handshake, report=report)
            except rpc.Refused:
                hint = remote_roles.secret_hint(self.args, self.secret_origin)
                raise rpc.Refused(
                    f'The {role} at {addr} kept refusing this command\'s run '
                    f'secret for {timeout} s (run.connect_timeout); start it '
                    f'with this run\'s secret: {hint}.') from None
            except rpc.Unreachable:
                raise rpc.Unreachable(
                    f'The {role} at {addr} did not come up within {timeout} '
                    f's (run.connect_timeout).') from None

    def _actor_wait_line(self, addr):
        """The launcher's one line while the actor of this launch is not up:
        the agent is being built (it prints what it compiles), and the env
        workers of this launch wait for it without lines of their own."""
        start = time.monotonic()

        def line():
            workers = len(self.envs.slots)
            waiting = (f'{workers} env worker{"s" if workers != 1 else ""} '
                       f'wait for it; ' if workers else '')
            return (
                f'Launcher: the agent is being built, its actor at {addr} '
                f'serves once the policy is compiled; {waiting}waited '
                f'{time.monotonic() - start:.0f} s so far.')
        return line

    def _call(self, role, method, *args, timeout=None):
        future = self.clients[role].call(method, *args)
        while not future.wait(0.1):
            self._check()
            if timeout is not None:
                timeout -= 0.1
                if timeout <= 0:
                    raise TimeoutError(f'{role}.{method} did not answer.')
        return future.result()

    def _loop(self, start, signal):
        args = self.args
        # With several replicas the learners decide saves and stops alike
        # on every replica (`_replica_events`); the launcher follows.
        replicated = args.replicas > 1
        should_save = embodied.LocalClock(args.save_every)
        should_log = embodied.LocalClock(args.log_every)
        should_save()
        should_log()
        if saving.resume_tag(
                args.logdir, report=False, replica=saving.replica_of(args),
                agree=False) is None:
            # A first consistent save, as load_or_save would (tag 0 on
            # every replica).
            self._save(tag=0 if replicated else None)
        while True:
            self._check()
            status = self._call('logger', 'status')
            self.step = int(status['step'])
            # The run's step: with several replicas, over all of them.
            step = int(status['run_step'])
            self.progress.observe(step)
            if args.remote_envs and not status['env_steps'] and (
                    time.monotonic() - start > args.connect_timeout):
                raise rpc.Unreachable(remote_roles.no_envs_message(
                    args, self._call('actor', 'status'), self.secret_origin))
            reason = stopping.stop_reason(args, step, start, signal)
            if reason:
                return reason
            if replicated:
                reason = self._replica_events()
                if reason:
                    return reason
            elif should_save():
                self._save()
            if should_log():
                self._print_progress(step)
            signal.event.wait(0.2)

    def _print_progress(self, step):
        actor = self._call('actor', 'status')
        replay = self._call('replay', 'status')
        line = self.progress.line(time.monotonic(), step, actor, replay)
        print(f'[Progress] {line}', flush=True)

