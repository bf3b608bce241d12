"""The control protocol: the launcher's methods on every role, declared once.

    status()      -> dict   the role's counters
    quiesce()     -> bool   hold new work back for a save; True once nothing
                            the role produced is still on its way (the
                            launcher polls it, so it may be called again)
    save(tag)     -> tag    save the role's state under `tag`
    resume()                undo `quiesce` after a save
    stop(stage)             one stage of the stop; the launcher names the
                            stages of each role in its order (`STAGES`)

Served over RPC by the agent (`AgentControl`, on the actor's server), the
replay (`ReplayRole`) and the logger (`LoggerRole`); with run.auth they
answer only the launcher's token. The env group (`EnvGroup`) speaks the
same protocol without a server: its workers are child processes of the
launcher, which stops them by signals and exit codes, not requests (an env
worker's only server is the actor it calls). The logger's `abandon` is a
further launcher method, outside the protocol: the launcher's bookkeeping
of a crashed env worker.
"""

from embodied.run.parallel import roles
from embodied.run.parallel import connections

CONTROL = ('status', 'quiesce', 'save', 'resume', 'stop')


class RoleControl:
    """A role's side of the protocol. Subclasses name their `ROLE` and stop
    `STAGES` (from `roles.TABLE`) and give each stage a method `_stop_<stage>`; `RPC` holds the
    protocol's methods, called by the launcher (a role with data methods
    adds its own entries to it)."""

    ROLE = 'role'  # Its name in `roles.TABLE`.
    STAGES = ()  # Its stop stages: `roles.stage_names(ROLE)`.
    RPC = dict.fromkeys(CONTROL, connections.LAUNCHER)

    def status(self):
        return {}

    def quiesce(self):
        return True

    def save(self, tag):
        return int(tag)

    def resume(self):
        return None

    def stop(self, stage):
        """Runs the stop stage `stage`; see `STAGES`."""
        if stage not in self.STAGES:
            raise ValueError(
                f'The {self.ROLE} has no stop stage {stage!r} (its stages: '
                f'{", ".join(self.STAGES)}).')
        return getattr(self, f'_stop_{stage}')()


class EnvGroup(RoleControl):
    """The launcher's env workers (`env.pool`) under the protocol, called
    in the launcher's process. The workers keep no state to save; `act`
    paused at the agent holds them back for a save."""

    ROLE = 'envs'
    STAGES = roles.stage_names(ROLE)

    def __init__(self, pool, exit_timeout=10):
        self.pool = pool
        self.exit_timeout = exit_timeout

    def status(self):
        return {'restarts': self.pool.restarts,
                'failed': self.pool.failed()}

    def _stop_restarts(self):
        """No crashed worker restarts from now on: workers may exit."""
        self.pool.stopping()

    def _stop_exit(self):
        """Waits for the workers to exit (the agent answered their `act`
        with the stop reply); kills those still running."""
        wait_or_kill(self.pool, self.exit_timeout, 'env workers')


def wait_or_kill(group, timeout, what):
    """Waits up to `timeout` s for `group`'s workers; kills the rest."""
    left = group.wait(timeout)
    if left:
        print(f'Killing {what} that did not exit: {left}', flush=True)
        group.kill()
