"""The launcher's lifecycle: one state machine over the roles' control
protocol (control.py). `launcher.combined` builds a `Launcher` and runs it.

    starting ─► running ─► (draining ─► saving ─► running)*
                        ─► draining ─► saving ─► stopping ─► stopped
    any state ─► failed

starting: the workers start and the launcher connects to the agent (at
run.actor_addr, or at run.agent_addr with the policy process, which then
serves run.actor_addr and gets a client of its own), the replay and the
logger. running: it reads the logger's
step, prints progress, and every run.save_every saves: draining (the agent
holds `act` back, the replay takes what is on its way) then saving (every
role under one tag), then running again; a save whose transitions did not
arrive within run.drain_timeout is skipped. At run.steps, run.duration or
a signal it stops in the order `_stop_steps` derives from the roles'
stop stages (`roles.TABLE`). failed: a worker ended the run; the roles
still alive save first (`_fail`), except after a write that found no room
(`_end_unsaved`: the same stop steps without drains and saves). Each role
resumes from the newest tag that every saving role holds completely.

Which roles there are, how each starts, where it serves, what it saves and
its stop stages: `roles.TABLE`. Control calls: `status`, `quiesce`,
`save`, `resume`, `stop(stage)` on every role with a server; logger
`abandon`; the env group's `stop` here.
"""

import enum
import functools
import os
import time

import embodied
from embodied import rpc
from embodied.core import broken_streams
from embodied.core import diskfull
from embodied.core import linewise
from embodied.core import outofmemory
from embodied.core import savetree
from embodied.run.parallel import connections
from embodied.run import progress
from embodied.run.parallel import roles
from embodied.run import saving
from embodied.run import stopping
from embodied.run.parallel import env
from embodied.run.parallel import control
from embodied.run.parallel import remote_roles

STOP_DRAIN = 3              # seconds a stop waits for transitions in flight


class State(enum.Enum):
    STARTING = 'starting'
    RUNNING = 'running'
    DRAINING = 'draining'
    SAVING = 'saving'
    STOPPING = 'stopping'
    STOPPED = 'stopped'
    FAILED = 'failed'


# The states each state may go to; any state may go to FAILED.
NEXT = {
    # DRAINING: an env worker failed before the run ran; the stop saves.
    State.STARTING: {State.RUNNING, State.DRAINING},
    State.RUNNING: {State.DRAINING},
    # RUNNING: a save skipped, its transitions did not arrive in time.
    State.DRAINING: {State.SAVING, State.RUNNING},
    # DRAINING: an env worker failed during a save; the stop saves again.
    State.SAVING: {State.RUNNING, State.STOPPING, State.DRAINING},
    State.STOPPING: {State.STOPPED},
    State.STOPPED: set(),
    State.FAILED: set(),
}


class Launcher:
    """The workers of one `combined` launch and the decisions about them:
    the roles of `roles.TABLE` with an entry in `group`, whose end ends
    the run; env workers in `envs` (`env.pool`), under the protocol as
    `env_group`. `state` is where the lifecycle is, `states` every state it
    entered."""

    def __init__(self, factories, args, handshake=None, secret_origin=None):
        self.args = args
        # Before the workers are made: they inherit it (`stopping.StopSignal`).
        self._fallback = broken_streams.set_fallback(
            os.path.join(args.logdir, broken_streams.FILENAME))
        self.secret_origin = secret_origin  # See `remote_roles.secret_origin`.
        self.handshake = handshake  # The control token's, with run.auth.
        self.group = rpc.Supervisor()
        for role in roles.TABLE:
            if role.entry and role.started_here(args):
                kind = rpc.Process if role.is_process(args) else rpc.Thread
                self.group.add(kind(
                    role.function(), *(factories[f] for f in role.factories),
                    args, name=role.worker))
        specs = []
        envs = roles.ROLES[roles.ENVS]
        if envs.started_here(args):
            specs = env.specs(*(factories[f] for f in envs.factories), args)
        self.envs = env.pool(specs, args, on_crash=self._env_crashed)
        self.env_group = control.EnvGroup(self.envs)
        self.clients = {}  # By role name (`roles.TABLE`).
        self.may_exit = ()  # Workers that may end with 0 (while stopping).
        self.progress = progress.Progress(args)
        self.step = 0  # The logger's step when last asked.
        self.saved = 0  # The newest save tag the learners asked for.
        self.state = State.STARTING
        self.states = [self.state]

    def _enter(self, state):
        if state == self.state:
            return
        if state != State.FAILED and state not in NEXT[self.state]:
            raise RuntimeError(
                f'The launcher cannot go from {self.state.value} to '
                f'{state.value}.')
        self.state = state
        self.states.append(state)

    # Starting and running.

    def run(self):
        args = self.args
        start = time.monotonic()
        servers = ', '.join(
            f'{role.addr_key(args).removesuffix("_addr")} at '
            f'{args[role.addr_key(args)]}'
            for role in roles.served(args))
        print(f'Launching {len(self.group.workers) + len(self.envs.slots)} '
              f'workers: {servers}.', flush=True)
        linewise.install()  # A lost stdout fails no print (broken_streams).
        try:
            with stopping.StopSignal(watch_output=True) as signal:
                # The env workers before the agent's thread, which
                # changes the environment as JAX starts: see
                # `rpc.Supervisor.start`.
                self.envs.start()
                self.group.start()
                self._print_workers()
                try:
                    self._connect()
                    self._enter(State.RUNNING)
                    reason = self._loop(start, signal)
                except Exception as e:
                    self._fail(e)
                    raise
                try:
                    self._stop(reason)
                except Exception as e:
                    if _ends_unsaved(e):
                        self._enter(State.FAILED)
                        self._end_unsaved()
                    raise
        except BaseException:
            self._enter(State.FAILED)
            self.envs.kill()
            self.group.kill()
            self._shutdown_remote()
            raise
        finally:
            for client in self.clients.values():
                client.close(1)
            broken_streams.set_fallback(self._fallback)

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
        client = self.clients.get(roles.STEPS)
        if client is not None:
            self._try(lambda: client.call('abandon', list(spec.envids)).result(
                timeout=10), f'Could not tell the logger to drop the episodes '
                f'of {spec.name}')

    def _shutdown_remote(self):
        """Best effort: tells a separately launched replay to exit too."""
        if self.args.remote_replay:
            self._try_call(roles.REPLAY, 'stop', 'exit', timeout=2)

    def _connect(self, limit=None):
        """Connects to every role. A remote role not up within
        run.connect_timeout ends the run naming its address; a role this
        launch started has no limit (`_check` ends the run if it dies), so
        a busy machine or a long compile is no error. With `limit` (after
        a failure, to save): the roles not yet connected, each within
        `limit` seconds, without `_check`."""
        for role in reversed(self._served()):
            if role in self.clients:
                continue
            timeout = limit or connections.connect_timeout(self.args, role)
            key = roles.addr_key(role, self.args)
            addr = self.args[key]
            report = None
            if (roles.ROLES[role].addr == 'actor_addr' and not limit
                    and timeout is None):
                report = self._agent_wait_line(role, addr)
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

    def _agent_wait_line(self, role, addr):
        """The launcher's one line while `role` (the agent, or the policy
        process that serves the actor) is not up: it is being built (it
        prints what it compiles), and the env workers of this launch wait
        for the actor without lines of their own."""
        start = time.monotonic()

        def line():
            workers = len(self.envs.slots)
            waiting = (f'{workers} env worker{"s" if workers != 1 else ""} '
                       f'wait for it; ' if workers else '')
            return (
                f'Launcher: the {role} is being built, its server at {addr} '
                f'serves once it is compiled; {waiting}waited '
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
            status = self._call(roles.STEPS, 'status')
            self.step = int(status['step'])
            # The run's step: with several replicas, over all of them.
            step = int(status['run_step'])
            self.progress.observe(step)
            if args.remote_envs and not status['env_steps'] and (
                    time.monotonic() - start > args.connect_timeout):
                raise rpc.Unreachable(remote_roles.no_envs_message(
                    args, self._agent_status(), self.secret_origin))
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

    def _agent_status(self):
        """The agent's status, completed by the roles that join it
        (`roles.Role.joins`: the policy process's actor counters)."""
        status = {}
        for role in roles.joined(roles.LEARNER, self.args):
            status.update(self._call(role, 'status'))
        return status

    def _print_progress(self, step):
        actor = self._agent_status()
        replay = self._call(roles.REPLAY, 'status')
        line = self.progress.line(time.monotonic(), step, actor, replay)
        print(f'[Progress] {line}', flush=True)

    def _replica_events(self):
        """With several replicas: saves under the tag the learners agreed
        on, and the reason to stop when another replica stopped the run."""
        status = self._call(roles.LEARNER, 'status')
        if status.get('learner_replica_stop'):
            return 'Another replica stopped the run'
        request = int(status.get('learner_save_request', 0))
        if request > self.saved:
            self.saved = request
            self._save(tag=request)
        return None

    # Draining and saving.

    def _save(self, tag=None):
        """Saves agent, replay and logger under the current step (or
        `tag`), then runs on; skips the save when the transitions in flight
        did not arrive within run.drain_timeout."""
        self._enter(State.DRAINING)
        if not self._quiesce(self.args.drain_timeout):
            print('Skipping this save: transitions did not arrive within '
                  f'{self.args.drain_timeout} s.', flush=True)
            self._resume()
            return None
        self._enter(State.SAVING)
        step = self._write_save(tag)
        self._resume()
        return step

    def _quiesce(self, timeout):
        """Asks every role to hold new work back (the agent holds `act`
        back, the replay takes what is on its way without waiting for the
        learner); True once each answered that nothing it produced is
        still on its way."""
        pending = [role for role in self._served()
                   if not self._call(role, 'quiesce')]
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
            pending = [role for role in pending
                       if not self._call(role, 'quiesce')]
        return True

    def _write_save(self, tag=None):
        """Has every saving role save under `tag` (default `_tag()`);
        returns the tag."""
        step = self._tag() if tag is None else int(tag)
        futures = [self.clients[role].call('save', step)
                   for role in roles.SAVED]
        for future in futures:
            while not future.wait(0.1):
                self._check()
            future.result()
        print(f'Saved checkpoints at step {step}.', flush=True)
        return step

    def _tag(self):
        """The tag of a save now: the logger's step, or with several
        replicas the run's update count the learners share."""
        if self.args.replicas > 1:
            status = self._call(roles.LEARNER, 'status')
            return int(status.get('learner_run_tag', 0))
        return int(self._call(roles.STEPS, 'status')['step'])

    def _resume(self):
        # The agent last: its `act` feeds the others.
        for role in reversed(self._served()):
            self._call(role, 'resume')
        self._enter(State.RUNNING)

    def _served(self):
        """The roles of this launch with a server, by name, in the table's
        order."""
        return [role.name for role in roles.served(self.args)]

    # Stopping.

    def _stop(self, reason, failed=False):
        """Drains, saves and ends every worker in the order of
        `_stop_steps`. With `failed`, an env worker already failed: the run
        still saves, and then fails."""
        step = int(self._call(roles.STEPS, 'status')['run_step'])
        print(f'{reason} at step {step}: saving and stopping.', flush=True)
        for state, _, action in self._stop_steps(step, failed):
            self._enter(state)
            action()

    def _stop_steps(self, step, failed, saving=True):
        """The stop, in order: (state, what, action). The roles' stop
        stages (`roles.stop_stages`) in their phases, with the drains, the
        final save and the summary between them; without `saving`, the
        same stages, each at most tried, and no drain or save."""
        drain, save, stop = State.DRAINING, State.SAVING, State.STOPPING

        def stages(phase, state):
            return [(state, f"run the {role}'s stop stage {stage}",
                     functools.partial(self._stop_stage, role, stage, saving))
                    for role, stage in roles.stop_stages(phase, self.args)]

        steps = stages('begin', drain)  # A crash from here on: no restart.
        if saving:
            # Drain while the learner still samples, so limiter waits end.
            steps.append((drain, 'drain', lambda: self._quiesce(STOP_DRAIN)))
        steps += stages('drain', drain)
        if saving:
            steps += [
                (drain, 'drain again', self._final_drain),
                (save, 'save', self._write_save),
                (stop, 'print the summary', lambda: self._summary(step))]
        steps.append((stop, 'let the workers exit', self._may_exit))
        steps += stages('envs', stop)
        steps += stages('exit', stop)
        steps.append((stop, 'wait for the workers', lambda: (
            control.wait_or_kill(self.group, 15, 'workers'))))
        if saving:
            steps += [
                (stop, 'check exit codes', lambda: self._check_exits(failed)),
                (State.STOPPED, 'done',
                 lambda: print('All workers exited.', flush=True))]
        return steps

    def _stop_stage(self, role, stage, strict=True):
        """Runs `role`'s stop stage `stage`; without `strict`, tries it."""
        if role == roles.ENVS:
            return self.env_group.stop(stage)
        if stage == 'exit':
            return self._stop_role(role, strict)
        if strict:
            return self._call(role, 'stop', stage)
        return self._try_call(role, 'stop', stage)

    def _final_drain(self):
        if not self._quiesce(STOP_DRAIN):
            print('Saving with transitions still in flight.', flush=True)

    def _summary(self, step):
        self._print_progress(step)
        summary = self.progress.summary(
            self._agent_status(), self.envs.restarts,
            score=self._call(roles.STEPS, 'status')['score'])
        print(f'[Summary] {summary}', flush=True)

    def _may_exit(self):
        """From now on (the agent answers every `act` with the stop reply)
        the roles' workers may exit with 0."""
        self.may_exit = [w.name for w in self.group.workers]

    def _check_exits(self, failed):
        self.group.check(expected=[w.name for w in self.group.workers])
        if not failed:
            for name, code in self.envs.failed():
                print(f'Env worker {name} ended with exit code {code} while '
                      f'stopping.', flush=True)

    def _stop_role(self, role, strict=True, timeout=10):
        """Asks a role to exit and, with `strict`, waits up to `timeout` s
        for its worker (when this launch started it), so that what it still
        sends on its way out arrives before the next role exits. Its reply can be lost
        when the role closes its server right away, so a missing reply is
        no error: the workers' exit codes decide."""
        try:
            if strict:
                self._call(role, 'stop', 'exit', timeout=timeout)
            else:
                self._try_call(role, 'stop', 'exit')
        except TimeoutError:
            pass
        if not strict:
            return
        worker = roles.ROLES[role].worker
        deadline = time.monotonic() + timeout
        for w in self.group.workers:
            while (w.name == worker and w.exitcode is None and
                   time.monotonic() < deadline):
                time.sleep(0.05)

    # Failing.

    def _fail(self, error):
        """Ends the run for `error`, saving first what can be saved; after
        a write that found no room, a device out of memory or a save() no
        save holds, stops every role without a save."""
        if _ends_unsaved(error):
            self._enter(State.FAILED)
            self._end_unsaved()
            return
        if not isinstance(error, rpc.WorkerFailed):
            return
        print(f'Ending the run: {error}', flush=True)
        if error.name in self.envs.names:
            # An env worker can fail before this launch reached every role
            # (the envs talk to the actor directly): reach them to save.
            served = len(self._served())
            if len(self.clients) < served:
                self._try(lambda: self._connect(limit=60),
                          'Could not reach every role to save')
            if len(self.clients) == served:
                # The other roles are fine: stop as usual, then fail.
                self.env_group.stop('restarts')
                self._try(lambda: self._stop(
                    f'Env worker {error.name} failed', failed=True),
                    'Could not save and stop in order')
                return
        self._enter(State.FAILED)
        self._salvage(error)

    def _salvage(self, error, timeout=60):
        """After a role died: the roles still alive save under the last step,
        as far as they can without it. A resume picks the newest save that
        every saving role holds, so a partial save never mixes into one."""
        dead = roles.BY_WORKER.get(error.name)
        alive = [role for role in roles.SAVED
                 if dead and role != dead.name and role in self.clients and
                 self.clients[role].connected]
        if not alive:
            return
        step = self.step
        if roles.STEPS in alive:
            step = self._try(lambda: int(self.clients[roles.STEPS].call(
                'status').result(timeout=5)['step'])) or step
        print(f'Saving what is left at step {step}: {", ".join(alive)}.',
              flush=True)
        for role in alive:
            self._try_call(role, 'quiesce')
        futures = {role: self.clients[role].call('save', step)
                   for role in alive}
        deadline = time.monotonic() + timeout
        for role, future in futures.items():
            self._try(lambda: future.result(
                timeout=max(0.1, deadline - time.monotonic())),
                f'The {role} could not save')
        for role in alive:
            # A role's thread ends only when asked; its process is ours.
            if not roles.ROLES[role].is_process(self.args):
                self._try_call(role, 'stop', 'exit')

    def _end_unsaved(self):
        """Ends every role in the stop's order without saving: after a write
        found no room a save would not fit either, after a device ran out of
        memory the agent's state may be lost (train donates it), and the
        saves on disk stay as they are (an agent whose save() no save holds
        would fail again). Roles already gone are skipped."""
        for _, what, action in self._stop_steps(self.step, True, False):
            self._try(action, f'Could not {what}')

    def _try_call(self, role, method, *args, timeout=5):
        client = self.clients.get(role)
        if client is not None and client.connected:
            self._try(lambda: client.call(method, *args).result(
                timeout=timeout))

    def _try(self, fn, what=None):
        try:
            return fn()
        except Exception as e:
            if what:
                print(f'{what}: {type(e).__name__}: {e}', flush=True)


def _ends_unsaved(error):
    """Whether `error` ends the run without a save: a write that found no
    room, a device out of memory, or an agent whose save() no save holds
    (`savetree.Unsavable`)."""
    return bool(diskfull.find(error) or outofmemory.find(error)
                or savetree.find(error))
