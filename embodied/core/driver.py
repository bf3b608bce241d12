"""Steps a batch of environments with a batched policy.

    driver = Driver([make_env] * 4, parallel=True, mode='train')
    driver.on_step(lambda tran, worker, mode: replay.add(tran, worker))
    driver.reset(agent.init_policy)
    driver(agent.policy, steps=1000)
    driver.close()

With `parallel=True` every env lives in its own spawned process and talks to
the driver over a pipe. This module must not import JAX: env processes import
it.
"""

import multiprocessing
import traceback

import cloudpickle
import elements
import numpy as np
import portal

from . import checks
from . import signals


class EnvError(RuntimeError):
    """An env failed; names the env index and keeps the remote traceback."""

    def __init__(self, index, message, remote_traceback=''):
        text = f'Env {index} {message}'
        if remote_traceback:
            text += f'\n\nTraceback in the env process:\n{remote_traceback}'
        super().__init__(text)
        self.index = index
        self.remote_traceback = remote_traceback


class Driver:
    """Steps `len(make_env_fns)` envs together.

    The policy is called as `policy(carry, obs, **kwargs) -> carry, act, out`
    on observations stacked along a leading batch axis, without the `log/`
    keys. Each callback is called as `fn(tran, worker_index, **kwargs)` once
    per env and step, where `tran` holds that env's observation (including
    `log/` keys), the action chosen for it and the policy's outputs; as in
    the original, not `reset` (the next step's `reset` is the `is_last` of
    this one). Envs whose observation was `is_last` get a zero action with
    `reset=True` next.
    """

    def __init__(self, make_env_fns, parallel=True, **kwargs):
        make_env_fns = list(make_env_fns)
        if not make_env_fns:
            raise ValueError('Driver: needs at least one env constructor.')
        self.parallel = parallel
        self.kwargs = kwargs
        self.length = len(make_env_fns)
        self.callbacks = []
        self.closed = False
        self.envs = []
        self.workers = []
        try:
            if parallel:
                for index, ctor in enumerate(make_env_fns):
                    self.workers.append(_EnvWorker(index, ctor))
                spaces = [worker.call('spaces') for worker in self.workers]
                self.obs_space, self.act_space = spaces[0]
            else:
                for ctor in make_env_fns:
                    self.envs.append(ctor())
                self.obs_space = self.envs[0].obs_space
                self.act_space = self.envs[0].act_space
        except BaseException:
            self.close()
            raise
        if 'reset' not in self.act_space:
            self.close()
            raise ValueError(
                f"Driver: the env act space has no 'reset' key "
                f"(keys: {sorted(self.act_space)}).")
        self.acts = None
        self.carry = None
        self.reset()

    def reset(self, init_policy=None):
        """Starts new episodes everywhere; `init_policy(N)` gives the carry."""
        self.acts = {
            k: np.zeros((self.length,) + v.shape, v.dtype)
            for k, v in self.act_space.items()}
        self.acts['reset'] = np.ones(self.length, bool)
        self.carry = init_policy and init_policy(self.length)

    def on_step(self, callback):
        self.callbacks.append(callback)

    def __call__(self, policy, steps=0, episodes=0):
        """Steps until at least `steps` steps and `episodes` episodes ended.

        Steps are counted over all envs together.
        """
        step, episode = 0, 0
        while step < steps or episode < episodes:
            step, episode = self._step(policy, step, episode)

    def close(self):
        """Closes every env and ends the env processes; safe to call twice."""
        if self.closed:
            return
        self.closed = True
        for worker in self.workers:
            worker.send_close()
        for worker in self.workers:
            worker.join_or_kill()
        errors = []
        for env in self.envs:
            try:
                env.close()
            except Exception as e:
                errors.append(e)
        if errors:
            raise errors[0]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _step(self, policy, step, episode):
        if self.closed:
            raise RuntimeError('Driver: used after close().')
        acts = [
            {k: v[i] for k, v in self.acts.items()}
            for i in range(self.length)]
        obs = self._step_envs(acts)
        obs = self._stack(obs)
        problem = checks.nonfinite(obs, None)
        if problem:
            raise ValueError(f'Driver: {problem}')
        logs = {k: v for k, v in obs.items() if k.startswith('log/')}
        obs = {k: v for k, v in obs.items() if not k.startswith('log/')}
        self.carry, acts, outs = policy(self.carry, obs, **self.kwargs)
        acts = self._check_acts(acts, outs)
        is_last = np.asarray(obs['is_last'], bool)
        if is_last.any():
            acts = {k: _zero_where(v, is_last) for k, v in acts.items()}
        self.acts = {**acts, 'reset': is_last.copy()}
        trans = {**obs, **acts, **outs, **logs}
        for i in range(self.length):
            tran = elements.tree.map(lambda x: x[i], trans)
            for fn in self.callbacks:
                fn(tran, i, **self.kwargs)
        return step + self.length, episode + int(is_last.sum())

    def _step_envs(self, acts):
        if not self.parallel:
            results = []
            for index, (env, act) in enumerate(zip(self.envs, acts)):
                try:
                    results.append(env.step(act))
                except Exception as e:
                    e.add_note(f'Raised by env {index} of the driver.')
                    raise
            return results
        try:
            for worker, act in zip(self.workers, acts):
                worker.send('step', act)
            return [worker.receive() for worker in self.workers]
        except BaseException:
            # The other envs are mid-step; the driver cannot go on.
            self.close()
            raise

    def _stack(self, obs):
        keys = set(obs[0])
        for index, ob in enumerate(obs):
            if set(ob) != keys:
                raise ValueError(
                    f'Driver: env {index} returned obs keys {sorted(ob)} but '
                    f'env 0 returned {sorted(keys)}.')
        return {k: np.stack([ob[k] for ob in obs]) for k in obs[0]}

    def _check_acts(self, acts, outs):
        missing = set(self.act_space) - {'reset'} - set(acts)
        if missing:
            raise ValueError(
                f'Driver: the policy returned no action for {sorted(missing)} '
                f'(act space keys: {sorted(self.act_space)}).')
        clash = set(acts) & set(outs)
        if clash:
            raise ValueError(
                f'Driver: keys {sorted(clash)} are both in the policy\'s '
                f'act and out.')
        acts = {k: np.asarray(v) for k, v in acts.items() if k != 'reset'}
        for key, value in acts.items():
            if value.ndim == 0 or len(value) != self.length:
                raise ValueError(
                    f"Driver: act '{key}' has shape {value.shape}, expected "
                    f"a leading batch axis of {self.length}.")
        return acts


def _zero_where(value, mask):
    mask = mask.reshape(mask.shape + (1,) * (value.ndim - 1))
    return np.where(mask, np.zeros_like(value), value)


class _EnvWorker:
    """One env in a spawned process, spoken to over a pipe."""

    def __init__(self, index, ctor):
        self.index = index
        self.pipe, remote = multiprocessing.get_context('spawn').Pipe()
        with signals.deferred():  # The run's launcher handles stop signals.
            self.process = portal.Process(
                _env_process, index, remote, cloudpickle.dumps(ctor),
                name=f'env{index}', start=True)
        # Only the child should hold its end, so its exit shows up as EOF.
        remote.close()

    def call(self, method, *args):
        self.send(method, *args)
        return self.receive()

    def send(self, method, *args):
        try:
            self.pipe.send((method, *args))
        except (BrokenPipeError, ConnectionError, OSError):
            raise self._died() from None

    def receive(self):
        try:
            status, payload = self.pipe.recv()
        except (EOFError, ConnectionError, OSError):
            raise self._died() from None
        if status == 'error':
            raise self._error(payload)
        return payload

    def send_close(self):
        try:
            self.pipe.send(('close',))
        except (BrokenPipeError, ConnectionError, OSError):
            pass

    def join_or_kill(self, timeout=5):
        self.process.join(timeout)
        if self.process.running:
            self.process.kill()
        self.process.join(timeout)
        self.pipe.close()

    def _died(self):
        # A process that failed sends its error before it exits; it may still
        # wait in the pipe when sending to the process failed.
        try:
            while self.pipe.poll():
                status, payload = self.pipe.recv()
                if status == 'error':
                    return self._error(payload)
        except (EOFError, ConnectionError, OSError):
            pass
        self.process.join(1)
        return EnvError(
            self.index,
            f'process ended unexpectedly (exit code {self.process.exitcode}).')

    def _error(self, payload):
        kind, message, remote_traceback = payload
        return EnvError(
            self.index, f'raised {kind}: {message}', remote_traceback)


def _env_process(index, pipe, ctor):
    """Body of an env process: builds the env and serves requests."""
    signals.ignore_in_child()
    env = None
    try:
        env = cloudpickle.loads(ctor)()
        while True:
            try:
                method, *args = pipe.recv()
            except (EOFError, ConnectionError):
                return  # The driver is gone.
            if method == 'step':
                pipe.send(('ok', env.step(*args)))
            elif method == 'spaces':
                pipe.send(('ok', (env.obs_space, env.act_space)))
            elif method == 'close':
                return
            else:
                raise ValueError(f'Unknown request {method!r}.')
    except Exception as e:
        # Report to the driver and exit cleanly: a crash would make portal
        # write its error file and bring down the whole program.
        try:
            pipe.send(('error', (
                type(e).__name__, str(e), traceback.format_exc())))
        except (BrokenPipeError, ConnectionError, OSError):
            pass
    finally:
        if env is not None:
            try:
                env.close()
            except Exception:
                pass  # Nothing more to report to a driver that is leaving.
        pipe.close()
