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
    only: (run key, value): the role is part of a launch only where
        `args[key] == value` (None: always).
    cede: the `run` key of its address while another role of the launch
        serves at `addr` (the agent's control, once the policy process
        serves the actor's address).
    joins: the role whose status its own completes in the launcher's
        progress lines (the policy's actor counters join the agent's).
    duty: what the launcher asks of this role besides the control protocol
        (`DUTIES`): 'steps' (it counts the run's env steps, episodes and
        score: the launcher's clock), 'learner' (its status holds the
        learner's counters and, with replicas, its save and stop
        requests), 'replay' (its status is the replay's line of the
        progress), 'envs' (the env workers the launcher itself starts).
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
    only: tuple = None
    cede: str = None
    joins: str = None
    duty: str = None

    def in_launch(self, args):
        """Whether this role is part of a launch with `args`."""
        return self.only is None or args.get(self.only[0]) == self.only[1]

    def addr_key(self, args=None):
        """The `run` key of its address in a launch with `args` (without
        `args`: `addr`)."""
        if self.cede and args is not None and any(
                role is not self and role.addr == self.addr and
                role.in_launch(args) for role in TABLE):
            return self.cede
        return self.addr

    def is_process(self, args):
        if isinstance(self.process, str):
            return bool(args[self.process])
        return self.process

    def started_here(self, args):
        """Whether this launch starts it: part of the launch and not
        flagged as separate."""
        return self.in_launch(args) and not (
            self.separate and args.get(self.separate, False))

    def function(self):
        """The function `entry` names."""
        return _load(self.entry)

    def classes(self):
        """The classes `serves` names."""
        return [_load(path) for path in self.serves]


def _load(path):
    from embodied.core import importing
    return importing.load(path)


TABLE = (
    # First: it quiesces first, resumes last and exits first (its `act`
    # feeds the replay and the logger).
    Role('policy', 'Policy',
         'embodied.run.parallel.policy:parallel_policy', ('agent',),
         addr='actor_addr', only=('policy_worker', 'process'),
         joins='agent',
         serves=('embodied.run.parallel.actor:ActorRole',
                 'embodied.run.parallel.policy:PolicyControl'),
         stop=(('envs', 'envs'), ('exit', 'exit'))),
    Role('agent', 'Agent',
         'embodied.run.parallel.agent:parallel_agent', ('agent',),
         addr='actor_addr', cede='agent_addr', process='agent_process',
         saves=True, duty='learner',
         serves=('embodied.run.parallel.actor:ActorRole',
                 'embodied.run.parallel.agent:AgentControl'),
         stop=(('learner', 'drain'), ('envs', 'envs'), ('exit', 'exit'))),
    Role('replay', 'Replay',
         'embodied.run.parallel.replay:parallel_replay',
         ('replay_train', 'replay_eval', 'stream'), addr='replay_addr',
         separate='remote_replay', scripts=('parallel_replay',), saves=True,
         duty='replay',
         serves=('embodied.run.parallel.replay:ReplayRole',),
         stop=(('release', 'drain'), ('exit', 'exit'))),
    Role('logger', 'Logger',
         'embodied.run.parallel.logger:parallel_logger', ('logger',),
         addr='logger_addr', saves=True, duty='steps',
         serves=('embodied.run.parallel.logger:LoggerRole',),
         stop=(('exit', 'exit'),)),
    Role('envs', 'Env', None, ('env_train', 'env_eval'),
         separate='remote_envs', scripts=('parallel_envs', 'parallel_env'),
         duty='envs',
         stop=(('restarts', 'begin'), ('exit', 'envs'))),
)

ROLES = {role.name: role for role in TABLE}
SERVED = tuple(role for role in TABLE if role.addr)
ADDR_KEYS = tuple(dict.fromkeys(
    key for role in SERVED for key in (role.addr, role.cede) if key))
SAVED = tuple(role.name for role in TABLE if role.saves)
SEPARATE = {role.separate: role for role in TABLE if role.separate}
BY_WORKER = {role.worker: role for role in TABLE}
# The role of each duty (`Role.duty`), by name: what the launcher asks for.
DUTIES = {role.duty: role.name for role in TABLE if role.duty}
STEPS, LEARNER, REPLAY, ENVS = (
    DUTIES[duty] for duty in ('steps', 'learner', 'replay', 'envs'))


def addr_key(name, args=None):
    """The `run` key of role `name`'s address (in a launch with `args`)."""
    return ROLES[name].addr_key(args)


def served(args):
    """The roles with a server in a launch with `args`, in order."""
    return tuple(role for role in SERVED if role.in_launch(args))


def joined(name, args):
    """Role `name` and, after it, the roles in a launch with `args` that
    join its status (`joins`), by name: a later one's keys win."""
    return [name] + [role.name for role in served(args) if role.joins == name]


def stop_stages(phase, args=None):
    """(role, stage) of every stop stage in `phase`, in the table's order
    (of the roles in a launch with `args`)."""
    assert phase in PHASES, phase
    return [(role.name, stage) for role in TABLE
            if args is None or role.in_launch(args)
            for stage, at in role.stop if at == phase]


def stage_names(name):
    """Role `name`'s stop stages, in order."""
    return tuple(stage for stage, _ in ROLES[name].stop)


# The tables of docs/parallel.md, rendered from `TABLE` (the RPC table
# imports the role modules, through `Role.classes`).

def rpc_table():
    """The RPC methods of every role as a markdown table: one row per
    address, server and caller (`TABLE`'s servers)."""
    lines = ['| address | method | served by | called by |',
             '|---|---|---|---|']
    for role in SERVED:
        for cls in role.classes():
            callers = {}
            for method, caller in cls.RPC.items():
                callers.setdefault(caller, []).append(f'`{method}`')
            for caller, methods in callers.items():
                lines.append(
                    f'| {_address(role, cls)} | {", ".join(methods)} | '
                    f'{role.name} (`{cls.__name__}`) | {caller} |')
    return '\n'.join(lines)


def _address(role, cls=None):
    """A role's address key in words, with the key it cedes to (but for
    `cls`, served at the address by whichever role is there)."""
    if not role.addr:
        return '–'
    text = f'`run.{role.addr}`'
    others = [other for other in SERVED
              if other is not role and other.addr == role.addr]
    if cls is not None and any(
            cls in other.classes() for other in others):
        return text
    if role.cede:
        text += f' (`run.{role.cede}` with ' + ', '.join(
            _condition(other) for other in others) + ')'
    return text


def _condition(role):
    key, value = role.only
    return f'`run.{key} {value}`'


def roles_table():
    """The roles of `TABLE` as a markdown table."""
    lines = ['| role | address | starts as | own command | saves | '
             'stop stages (phase) |', '|---|---|---|---|---|---|']
    for role in TABLE:
        if isinstance(role.process, str):
            starts = f'thread; a process with `run.{role.process} True`'
        else:
            starts = 'process' if role.entry else 'processes (`run.envs`)'
        if role.only:
            starts += f', only with {_condition(role)}'
        own = ', '.join(f'`--script {s}`' for s in role.scripts)
        own = f'{own} (`run.{role.separate} True`)' if own else '–'
        stages = ', '.join(f'{stage} ({phase})' for stage, phase in role.stop)
        lines.append(
            f'| {role.name} | {_address(role)} '
            f'| {starts} | {own} | '
            f'{f"`ckpt/{role.name}`" if role.saves else "–"} | {stages} |')
    return '\n'.join(lines)
