"""The launcher: `combined` starts every role and alone decides stop and save.

    combined(make_agent, make_replay_train, make_replay_eval, make_env_train,
             make_env_eval, make_stream, make_logger, args):
        start workers: Agent (actor + learner), Logger, Replay, env workers
        connect to logger, replay, actor
        first save (a fresh run), then until run.steps / run.duration / a signal:
            read the logger's step; every run.save_every: save; print progress
        stop: drain, stop the learner, release the replay, final save,
              stop the envs, shut the roles down; every worker exits 0

A save pauses the actor and waits until every transition it produced is in
the replay and the logger (the learner keeps training meanwhile, so limiter
waits drain), reads the logger's step, and has the agent, replay (with the
limiter) and logger save under that step as their checkpoint tag. On start
each role loads the newest tag that all three hold completely.

Faults: crashed env workers restart (`envpool`, `run.env_restarts`). An env
error a restart cannot fix stops the run in order with a save, then
`combined` raises `rpc.WorkerFailed` naming the worker and its error. When
the agent, replay or logger dies, the others save under the last step and
everything is killed (`_salvage`).

Peers (`rpc.auth`, with run.auth): the launcher makes the run's secret (or
takes run.secret / EMBODIED_SECRET, or with roles started as separate
commands the logdir's secret file), hands its workers the data token only,
and alone holds the control token its own clients open with.

Signals: SIGTERM, however often and to however many processes of the run,
asks for a stop after the current step with a final save; workers ignore
SIGTERM and SIGINT (`core.signals`); a second SIGINT aborts.

RPC methods called: actor `pause`, `resume`, `drained`, `status`, `save`,
`stop_learner`, `stop_envs`, `shutdown`; replay `status`, `save`, `release`,
`shutdown`; logger `status`, `save`, `abandon`, `shutdown`.
"""

import multiprocessing
import os
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
from embodied.run import wiring
from embodied.run.parallel import env
from embodied.run.parallel import envpool
from embodied.run.parallel import roles
from embodied.run.parallel.agent import parallel_agent
from embodied.run.parallel.logger_server import parallel_logger
from embodied.run.parallel.replay_server import parallel_replay

ADDR_KEYS = ('actor_addr', 'replay_addr', 'logger_addr')

STOP_DRAIN = 3              # seconds a stop waits for transitions in flight
PORT_ATTEMPTS = 3


@ending.in_one_line
def combined(
        make_agent, make_replay_train, make_replay_eval, make_env_train,
        make_env_eval, make_stream, make_logger, args):
    """Runs the whole training launch until it stops; see the module doc.

    Every worker is a spawned process, which imports the script that called
    `combined` again (as `__mp_main__`). A script must therefore call it
    under a guard, or each worker would start a launch of its own:

        if __name__ == '__main__':
            combined(...)

    Without the guard, the workers end at once with an error saying so.
    """
    _refuse_in_spawned_worker()
    args = arguments.normalize(args)
    validation.check_parallel(args)
    factories = dict(
        agent=make_agent, replay_train=make_replay_train,
        replay_eval=make_replay_eval, env_train=make_env_train,
        env_eval=make_env_eval, stream=make_stream, logger=make_logger)
    factories = {k: wiring.dumps(v) for k, v in factories.items()}
    origin = roles.secret_origin(args)
    creds = _credentials(args)
    for line in roles.start_lines(args, origin):
        print(line, flush=True)
    if creds:  # The workers get the data token, never the control token.
        args = args.update(secret=creds.for_workers().encode())
    if args.get('from_checkpoint') and saving.resume_tag(args.logdir, report=False) is None:
        saving.agent_save_folder(args.from_checkpoint)
    auto = any('{auto}' in str(args[k]) for k in ADDR_KEYS)
    for attempt in range(PORT_ATTEMPTS):
        filled = rpc.addresses.fill_auto(
            {k: args[k] for k in ADDR_KEYS}, wiring.ipv6(args))
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



def _credentials(args):
    """The launch's credentials (see `rpc.auth`), None with run.auth False:
    from run.secret or EMBODIED_SECRET when given; else a new secret for
    this launch, or with roles started as separate commands the one in the
    logdir that they read too."""
    if not args.auth:
        return None
    secret = args.secret or os.environ.get(rpc.auth.ENV_VAR)
    if not secret:
        if args.remote_envs or args.remote_replay or args.replicas > 1:
            secret = rpc.auth.secret_file(args.logdir)
        else:
            secret = rpc.auth.new_secret()
    return rpc.auth.Credentials.decode(secret)


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


class _Launch:
    """The workers of one `combined` launch and the decisions about them.

    The agent, logger and replay are in `group`; any of them ending ends the
    run (the roles still alive save first, see `_salvage`). Env workers are
    in `envs`, which restarts crashed ones; an env error that a restart
    cannot fix ends the run after a full coordinated save (`_stop`).
    """

    ROLE_OF = {'Agent': 'actor', 'Replay': 'replay', 'Logger': 'logger'}

    def __init__(self, factories, args, handshake=None, secret_origin=None):
        self.args = args
        self.secret_origin = secret_origin  # See `roles.secret_origin`.
        self.handshake = handshake  # The control token's, with run.auth.
        self.factories = factories
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
        self.envs = envpool.EnvPool(
            specs, args.env_restarts, on_crash=self._env_crashed)
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
                    self._connect(start)
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
        parts = []
        for worker in self.group.workers + self.envs.workers:
            pid = getattr(worker, 'pid', None)
            parts.append(f'{worker.name} (pid {pid})' if pid else
                         f'{worker.name} (thread)')
        print(f'Workers: {", ".join(parts)}.', flush=True)

    def _check(self):
        """Raises `WorkerFailed` for a worker that ends the run; restarts
        crashed env workers."""
        self.group.check(self.may_exit)
        self.envs.poll()

    def _env_crashed(self, spec, exitcode, error):
        client = self.clients.get('logger')
        if client is None:
            return
        try:
            client.call('abandon', list(spec.envids)).result(timeout=10)
        except Exception as e:
            print(f'Could not tell the logger to drop the episodes of '
                  f'{spec.name}: {type(e).__name__}: {e}', flush=True)

    def _fail(self, error):
        """Ends the run for `error`, saving first what can be saved; after
        a write that found no room, stops every role without a save."""
        if diskfull.find(error) is not None:
            self._end_unsaved()
            return
        if not isinstance(error, rpc.WorkerFailed):
            return
        print(f'Ending the run: {error}', flush=True)
        if error.name in self.envs.names and len(self.clients) == 3:
            # Agent, replay and logger are fine: stop as usual, then fail.
            self.envs.stopping()
            try:
                self._stop(f'Env worker {error.name} failed', failed=True)
            except Exception as e:
                print(f'Could not save and stop in order: '
                      f'{type(e).__name__}: {e}', flush=True)
            return
        self._salvage(error)

    def _salvage(self, error, timeout=60):
        """After a role died: the roles still alive save under the last step,
        as far as they can without it. A resume picks the newest save that
        all three roles hold, so a partial save never mixes into one."""
        dead = self.ROLE_OF.get(error.name)
        alive = [role for role in ('replay', 'logger', 'actor')
                 if role != dead and role in self.clients and
                 self.clients[role].connected]
        if not alive or dead is None:
            return
        step = self.step
        if 'logger' in alive:
            try:
                step = int(self.clients['logger'].call('status').result(
                    timeout=5)['step'])
            except Exception:
                pass
        print(f'Saving what is left at step {step}: {", ".join(alive)}.',
              flush=True)
        if 'actor' in alive:
            self._try(lambda: self.clients['actor'].call('pause').result(
                timeout=5))
        futures = {role: self.clients[role].call('save', step)
                   for role in alive}
        deadline = time.monotonic() + timeout
        for role, future in futures.items():
            self._try(lambda: future.result(
                timeout=max(0.1, deadline - time.monotonic())),
                f'The {role} could not save')
        if 'actor' in alive:
            # An agent thread ends only when asked; its process is ours.
            self._try(lambda: self.clients['actor'].call('shutdown').result(
                timeout=5))

    def _end_unsaved(self):
        """Ends every role in order without saving: after a write found no
        room a save would not fit either, and the saves on disk stay as
        they are. Roles already gone are skipped."""
        self.envs.stopping()
        self.may_exit = [w.name for w in self.group.workers]
        for role, method in (('actor', 'stop_learner'),
                             ('actor', 'stop_envs')):
            self._try_call(role, method)
        if self.envs.wait(10):
            self.envs.kill()
        for role in ('actor', 'replay', 'logger'):
            self._try_call(role, 'shutdown')
        if self.group.wait(15):
            self.group.kill()

    def _try_call(self, role, method, timeout=5):
        client = self.clients.get(role)
        if client is not None and client.connected:
            self._try(lambda: client.call(method).result(timeout=timeout))

    def _try(self, fn, what=None):
        try:
            return fn()
        except Exception as e:
            if what:
                print(f'{what}: {type(e).__name__}: {e}', flush=True)

    def _shutdown_remote(self):
        """Best effort: tells a separately launched replay to exit too."""
        client = self.clients.get('replay')
        if self.args.remote_replay and client and client.connected:
            try:
                client.call('shutdown').result(timeout=2)
            except Exception:
                pass

    def _connect(self, start):
        """Connects to every role. A remote role not up within
        run.connect_timeout of when the launcher starts waiting for it ends
        the run naming its address; a role this launch started has no limit
        (`_check` ends the run if it dies), so a busy machine or a long
        compile is no error."""
        for role in ('logger', 'replay', 'actor'):
            timeout = wiring.connect_timeout(self.args, role)
            addr = self.args[f'{role}_addr']
            options = {'handshake': self.handshake} if self.handshake else {}
            client = rpc.Client(
                rpc.addresses.client_addr(addr, wiring.ipv6(self.args)),
                f'Launcher{role.title()}', logging=False, **options)
            begin = time.monotonic()
            next_report = begin + self.args.wait_report
            while not client.connect(0.2):
                self._check()
                now = time.monotonic()
                if timeout is not None and now - begin > timeout:
                    client.close(1)
                    if client.socket.refusal:
                        hint = roles.secret_hint(self.args, self.secret_origin)
                        raise rpc.Refused(
                            f'The {role} at {addr} kept refusing this '
                            f'command\'s run secret for {timeout} s '
                            f'(run.connect_timeout); start it with this '
                            f'run\'s secret: {hint}.')
                    raise rpc.Unreachable(
                        f'The {role} at {addr} did not come up within '
                        f'{timeout} s (run.connect_timeout).')
                if now >= next_report and not client.socket.refusal:
                    next_report = now + self.args.wait_report
                    print(f'Launcher: waiting for the {role} at {addr} for '
                          f'{now - begin:.0f} s '
                          f'({rpc.client.wait_limit(timeout)}).', flush=True)
            self.clients[role] = client

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
                raise rpc.Unreachable(roles.no_envs_message(
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

    def _replica_events(self):
        """With several replicas: saves under the tag the learners agreed
        on, and the reason to stop when another replica stopped the run."""
        status = self._call('actor', 'status')
        if status.get('learner_replica_stop'):
            return 'Another replica stopped the run'
        request = int(status.get('learner_save_request', 0))
        if request > self.saved:
            self.saved = request
            self._save(tag=request)
        return None

    def _tag(self):
        """The tag of a save now: the logger's step, or with several
        replicas the run's update count the learners share."""
        if self.args.replicas > 1:
            status = self._call('actor', 'status')
            return int(status.get('learner_run_tag', 0))
        return int(self._call('logger', 'status')['step'])

    def _quiesce(self, timeout):
        """Pauses the actor; True once everything it sent has arrived. The
        replay takes it without waiting for the learner (`drain`)."""
        self._call('actor', 'pause')
        self._call('replay', 'drain', True)
        deadline = time.monotonic() + timeout
        while not self._call('actor', 'drained'):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def _save(self, final=False, tag=None):
        """Saves agent, replay and logger under the current step (or
        `tag`)."""
        drained = self._quiesce(STOP_DRAIN if final else self.args.drain_timeout)
        if not drained:
            if not final:
                print('Skipping this save: transitions did not arrive within '
                      f'{self.args.drain_timeout} s.', flush=True)
                self._resume()
                return None
            print('Saving with transitions still in flight.', flush=True)
        step = self._tag() if tag is None else int(tag)
        futures = [self.clients[role].call('save', step)
                   for role in ('replay', 'logger', 'actor')]
        for future in futures:
            while not future.wait(0.1):
                self._check()
            future.result()
        print(f'Saved checkpoints at step {step}.', flush=True)
        if not final:
            self._resume()
        return step

    def _resume(self):
        self._call('replay', 'drain', False)
        self._call('actor', 'resume')

    def _stop(self, reason, failed=False):
        """Drains, saves and ends every worker in order. With `failed`, an
        env worker already failed: the run still saves, and then fails."""
        self.envs.stopping()  # A crash from here on needs no restart.
        step = int(self._call('logger', 'status')['run_step'])
        print(f'{reason} at step {step}: saving and stopping.', flush=True)
        # Drain while the learner still samples, so limiter waits end.
        self._quiesce(STOP_DRAIN)
        self._call('actor', 'stop_learner')
        self._call('replay', 'release')  # Inserts left skip the limiter.
        self._save(final=True)
        self._print_progress(step)
        summary = self.progress.summary(
            self._call('actor', 'status'), self.envs.restarts,
            score=self._call('logger', 'status')['score'])
        print(f'[Summary] {summary}', flush=True)
        self.may_exit = [w.name for w in self.group.workers]
        self._call('actor', 'stop_envs')
        left = self.envs.wait(10)
        if left:
            print(f'Killing env workers that did not exit: {left}', flush=True)
            self.envs.kill()
        self._shutdown('actor')
        agent = self.group.workers[0]
        deadline = time.monotonic() + 10
        while agent.exitcode is None and time.monotonic() < deadline:
            time.sleep(0.05)
        self._shutdown('replay')
        self._shutdown('logger')
        left = self.group.wait(15)
        if left:
            print(f'Killing workers that did not exit: {left}', flush=True)
            self.group.kill()
        self.group.check(expected=[w.name for w in self.group.workers])
        if not failed:
            for name, code in self.envs.failed():
                print(f'Env worker {name} ended with exit code {code} while '
                      f'stopping.', flush=True)
        print('All workers exited.', flush=True)

    def _shutdown(self, role, timeout=10):
        """Asks a role to exit. Its reply can be lost when the role closes
        its server right away, so a missing reply is no error: the workers'
        exit codes decide."""
        try:
            self._call(role, 'shutdown', timeout=timeout)
        except TimeoutError:
            pass

    def _print_progress(self, step):
        actor = self._call('actor', 'status')
        replay = self._call('replay', 'status')
        line = self.progress.line(time.monotonic(), step, actor, replay)
        print(f'[Progress] {line}', flush=True)

