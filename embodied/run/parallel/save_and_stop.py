"""The launcher's save and stop protocol, one step at a time over RPC.

A save pauses the actor and waits until every transition it produced is in
the replay and the logger (the learner trains on, so limiter waits drain),
then has the agent, replay (with the limiter) and logger save under the
logger's step as their tag; each role resumes from the newest tag that all
three hold completely. A stop drains while the learner still samples, stops
the learner, releases the replay, saves a last time, then ends the env
workers, the agent, the replay and the logger, in that order. When the
agent, replay or logger dies, the roles still alive save under the last
step (`_salvage`).

RPC methods called: actor `pause`, `resume`, `drained`, `status`, `save`,
`stop_learner`, `stop_envs`, `shutdown`; replay `status`, `drain`, `save`,
`release`, `shutdown`; logger `status`, `save`, `shutdown`.
"""

import time

from embodied import rpc
from embodied.core import diskfull

STOP_DRAIN = 3              # seconds a stop waits for transitions in flight


class SaveAndStop:
    """The save and stop steps of the launcher (`launch._Launch`, which
    provides `args`, `clients` by role, `_call(role, method, *args)`,
    `_check()`, the worker groups `group` and `envs`, `progress`,
    `_print_progress(step)`, and the counters `step` and `saved`)."""

    ROLE_OF = {'Agent': 'actor', 'Replay': 'replay', 'Logger': 'logger'}

    def _fail(self, error):
        """Ends the run for `error`, saving first what can be saved; after
        a write that found no room, stops every role without a save."""
        if diskfull.find(error) is not None:
            self._end_unsaved()
            return
        if not isinstance(error, rpc.WorkerFailed):
            return
        print(f'Ending the run: {error}', flush=True)
        if error.name in self.envs.names:
            # An env worker can fail before this launch reached every role
            # (the envs talk to the actor directly): reach them to save.
            if len(self.clients) < 3:
                self._try(lambda: self._connect(limit=60),
                          'Could not reach every role to save')
            if len(self.clients) == 3:
                # Agent, replay and logger are fine: stop as usual, then
                # fail.
                self.envs.stopping()
                self._try(lambda: self._stop(
                    f'Env worker {error.name} failed', failed=True),
                    'Could not save and stop in order')
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
            step = self._try(lambda: int(self.clients['logger'].call(
                'status').result(timeout=5)['step'])) or step
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
        self._wait_or_kill(self.envs, 10, 'env workers')
        for role in ('actor', 'replay', 'logger'):
            self._try_call(role, 'shutdown')
        self._wait_or_kill(self.group, 15, 'workers')

    def _wait_or_kill(self, group, timeout, what):
        left = group.wait(timeout)
        if left:
            print(f'Killing {what} that did not exit: {left}', flush=True)
            group.kill()

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
        self._wait_or_kill(self.envs, 10, 'env workers')
        self._shutdown('actor')
        agent = self.group.workers[0]
        deadline = time.monotonic() + 10
        while agent.exitcode is None and time.monotonic() < deadline:
            time.sleep(0.05)
        self._shutdown('replay')
        self._shutdown('logger')
        self._wait_or_kill(self.group, 15, 'workers')
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
