"""The parallel runner: agent, replay, logger and envs in separate workers.

    env workers ──act(obs)──► agent: actor thread ──add_batch──► replay
               ◄──actions───         (batches envs)  ──tran─────► logger
                                    learner thread ◄─sample_batch_*─ replay
                                                   ──update───────►
                                                   ──add(metrics)─► logger
    launcher (`combined`): starts the workers, decides stop and save, prints
    progress.

The roles, how each starts, where it serves, what it saves and its stop
stages are one table, `embodied.run.roles` (`roles_table()` renders it).
One module per role (agent_process with its actor and learner threads,
replay_server, logger_server, env). A role with a server serves the RPC
methods its classes declare in their `RPC` tables ({method: who calls
it}), which `connections.bind_role` binds and `rpc_table()` lists; the
learner and the env workers are clients only. Helpers: `entry`
(`combined`), `launcher` (the launcher's lifecycle as one state machine),
`lifecycle` (the control methods every role serves, declared once),
`link` (what actor and learner share), `remote_roles` (roles started as
separate commands), `connections` (servers, clients, factories as bytes)
and `replay_files` (the replay's files in the logdir). Entry points keep
the original's signatures; every factory may be given as a callable or as
its cloudpickled bytes.
"""

from embodied.run.parallel.actor import ActorRole
from embodied.run.parallel.actor import parallel_actor
from embodied.run.parallel.agent_process import AgentControl
from embodied.run.parallel.agent_process import parallel_agent
from embodied.run.parallel.env import parallel_env
from embodied.run.parallel.env import parallel_envs
from embodied.run.parallel.entry import combined
from embodied.run.parallel.learner import parallel_learner
from embodied.run.parallel.logger_server import LoggerRole
from embodied.run.parallel.logger_server import parallel_logger
from embodied.run.parallel.replay_server import ReplayRole
from embodied.run.parallel.replay_server import parallel_replay
from embodied.run import roles
from embodied.run.saving import resume_tag



def rpc_table():
    """The RPC methods of every role as a markdown table: one row per
    address, server and caller (`roles.TABLE`'s servers)."""
    lines = ['| address | method | served by | called by |',
             '|---|---|---|---|']
    for role in roles.SERVED:
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
    others = [other for other in roles.SERVED
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
    """The roles of `roles.TABLE` as a markdown table."""
    lines = ['| role | address | starts as | own command | saves | '
             'stop stages (phase) |', '|---|---|---|---|---|---|']
    for role in roles.TABLE:
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
