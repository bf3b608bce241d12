"""The roles of the parallel runner, as one table.

Each row names a role once, and the rest derives from it: the workers the
launcher starts and how (`entry`, `process`), the address keys (`ADDR_KEYS`), the
checkpoint folders (`SAVED`), the scripts that start a role as its own
command (`SEPARATE`), the launcher's stop order (`stop_stages`) and the
roles and RPC tables of docs/parallel.md (`parallel.roles_table()`,
`parallel.rpc_table()`). A new role adds its module, a row here and its
config keys and docs.

The table holds data only (entries are 'module:function' strings), so the
single-process runners, the config checks and the command line read it
without importing the roles.
"""

import dataclasses
import importlib

# The phases of the launcher's stop, in order. 'begin': before anything
# drains. 'drain': after the first drain, before the final one and the save.
# 'envs': after the save, while the env workers end. 'exit': the roles end,
# in the table's order.
PHASES = ('begin', 'drain', 'envs', 'exit')


@dataclasses.dataclass(frozen=True)
class Role:
    """One role of the parallel runner.

    name: the role's one name: its checkpoint folder, its launcher client,
        its control protocol's `ROLE`.
    worker: the name of its process or thread in the run's lines.
    entry: 'module:function' the launcher starts it with (None: the
        launcher starts it its own way, as the env workers' pool).
    factories: the launch's factories handed to `entry`, in order.
    addr: the `run` key of its server's address (None: it serves none).
    process: True (a process), False (a thread of the launcher), or the
        `run` key whose value says which (True: a process).
    separate: the `run` key that says it is started as its own command.
    scripts: the `--script`s that start it as its own command (the first
        is the one the launch's start line names).
    serves: 'module:Class' of each class whose `RPC` table its server
        serves.
    saves: whether it saves under `ckpt/<name>`.
    stop: its stop stages, in order, each as (stage, phase of `PHASES`).
    """

    name: str
    worker: str
    entry: str = None
    factories: tuple = ()
    addr: str = None
    process: object = True
    separate: str = None
    scripts: tuple = ()
    serves: tuple = ()
    saves: bool = False
    stop: tuple = ()

    def is_process(self, args):
        if isinstance(self.process, str):
            return bool(args[self.process])
        return self.process

    def started_here(self, args):
        """Whether this launch starts it (not flagged as separate)."""
        return not (self.separate and args.get(self.separate, False))

    def function(self):
        """The function `entry` names."""
        return _load(self.entry)

    def classes(self):
        """The classes `serves` names."""
        return [_load(path) for path in self.serves]


def _load(path):
    module, name = path.split(':')
    return getattr(importlib.import_module(module), name)


TABLE = (
    Role('agent', 'Agent',
         'embodied.run.parallel.agent_process:parallel_agent', ('agent',),
         addr='actor_addr', process='agent_process', saves=True,
         serves=('embodied.run.parallel.actor:ActorRole',
                 'embodied.run.parallel.agent_process:AgentControl'),
         stop=(('learner', 'drain'), ('envs', 'envs'), ('exit', 'exit'))),
    Role('replay', 'Replay',
         'embodied.run.parallel.replay_server:parallel_replay',
         ('replay_train', 'replay_eval', 'stream'), addr='replay_addr',
         separate='remote_replay', scripts=('parallel_replay',), saves=True,
         serves=('embodied.run.parallel.replay_server:ReplayRole',),
         stop=(('release', 'drain'), ('exit', 'exit'))),
    Role('logger', 'Logger',
         'embodied.run.parallel.logger_server:parallel_logger', ('logger',),
         addr='logger_addr', saves=True,
         serves=('embodied.run.parallel.logger_server:LoggerRole',),
         stop=(('exit', 'exit'),)),
    Role('envs', 'Env', None, ('env_train', 'env_eval'),
         separate='remote_envs', scripts=('parallel_envs', 'parallel_env'),
         stop=(('restarts', 'begin'), ('exit', 'envs'))),
)

ROLES = {role.name: role for role in TABLE}
SERVED = tuple(role for role in TABLE if role.addr)
ADDR_KEYS = tuple(role.addr for role in SERVED)
SAVED = tuple(role.name for role in TABLE if role.saves)
SEPARATE = {role.separate: role for role in TABLE if role.separate}
BY_WORKER = {role.worker: role for role in TABLE}


def addr_key(name):
    """The `run` key of role `name`'s address."""
    return ROLES[name].addr


def stop_stages(phase):
    """(role, stage) of every stop stage in `phase`, in the table's order."""
    assert phase in PHASES, phase
    return [(role.name, stage) for role in TABLE
            for stage, at in role.stop if at == phase]


def stage_names(name):
    """Role `name`'s stop stages, in order."""
    return tuple(stage for stage, _ in ROLES[name].stop)
