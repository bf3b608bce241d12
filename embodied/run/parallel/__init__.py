"""The parallel runner: agent, replay, logger and envs in separate workers.

    env workers ──act(obs)──► agent: actor thread ──add_batch──► replay
               ◄──actions───         (batches envs)  ──tran─────► logger
                                    learner thread ◄─sample_batch_*─ replay
                                                   ──update───────►
                                                   ──add(metrics)─► logger
    launcher (`combined`): starts the workers, decides stop and save, prints
    progress.

One module per role, each opening with its loop and the RPC methods it
serves and calls; each role's logic is a class whose methods are its RPC
methods, declared once in its `RPC` table ({method: who calls it}), and the
module's tail binds it to a server (`connections.bind_role`):

    launch.py          combined: starts the roles, decides stop and save
    save_and_stop.py   the launcher's save and stop protocol
    agent_process.py   parallel_agent, AgentControl: the agent process
    actor.py           parallel_actor, ActorRole: serves `act`
    learner.py         parallel_learner: trains from the replay's batches
    replay_server.py   parallel_replay, ReplayRole: replays and the limiter
    logger_server.py   parallel_logger, LoggerRole: the global step, metrics
    env.py             parallel_env, parallel_envs: env worker processes

and their helpers: `link` (what actor and learner share, each field with
its lock), `envpool` (restarting env workers), `remote_stream` (the
learner's batch stream), `remote_roles` (roles started as separate
commands). `rpc_table()` lists every role's RPC methods, as
docs/parallel.md shows them; which thread of the agent process calls each
agent method is the table atop `embodied/jax/agent.py`.

Entry points keep the original's signatures. Every factory may be given as
a callable or as its cloudpickled bytes. `python -m embodied.run.parallel`
takes the same flags as `python -m embodied.main`.
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
from embodied.run.parallel.replay_server import add_rows
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
