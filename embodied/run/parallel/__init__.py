"""The parallel runner: agent, replay, logger and envs in separate workers.

    env workers ──act(obs)──► agent: actor thread ──add_batch──► replay
               ◄──actions───         (batches envs)  ──tran─────► logger
                                    learner thread ◄─sample_batch_*─ replay
                                                   ──update───────►
                                                   ──add(metrics)─► logger
    launcher (`combined`): starts the workers, decides stop and save, prints
    progress.

One module per role (launch, agent_process, actor, learner, replay_server,
logger_server, env); each role's logic is a class whose methods are its RPC
methods, declared once in its `RPC` table ({method: who calls it}), which
`connections.bind_role` binds to a server and `rpc_table()` lists. Helpers:
`lifecycle` (the control methods every role serves, declared once),
`launcher` (the launcher's lifecycle as one state machine), `link` (what
actor and learner share) and `remote_roles` (roles started as separate
commands). Entry
points keep the original's signatures; every factory may be given as a
callable or as its cloudpickled bytes.
"""

from embodied.run.parallel.actor import ActorRole
from embodied.run.parallel.actor import parallel_actor
from embodied.run.parallel.agent_process import AgentControl
from embodied.run.parallel.agent_process import parallel_agent
from embodied.run.parallel.env import parallel_env
from embodied.run.parallel.env import parallel_envs
from embodied.run.parallel.launch import combined
from embodied.run.parallel.learner import parallel_learner
from embodied.run.parallel.logger_server import LoggerRole
from embodied.run.parallel.logger_server import parallel_logger
from embodied.run.parallel.replay_server import ReplayRole
from embodied.run.parallel.replay_server import parallel_replay
from embodied.run.saving import resume_tag

# The servers of a run: (address, role, the class whose `RPC` it serves).
SERVERS = (
    ('run.actor_addr', 'actor', ActorRole),
    ('run.actor_addr', 'agent (`AgentControl`)', AgentControl),
    ('run.replay_addr', 'replay', ReplayRole),
    ('run.logger_addr', 'logger', LoggerRole),
)


def rpc_table():
    """The RPC methods of every role as a markdown table: one row per
    address, server and caller."""
    lines = ['| address | method | served by | called by |',
             '|---|---|---|---|']
    for addr, role, cls in SERVERS:
        callers = {}
        for method, caller in cls.RPC.items():
            callers.setdefault(caller, []).append(f'`{method}`')
        for caller, methods in callers.items():
            lines.append(
                f'| `{addr}` | {", ".join(methods)} | {role} | {caller} |')
    return '\n'.join(lines)
