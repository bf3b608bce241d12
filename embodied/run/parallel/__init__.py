"""The parallel runner: agent, replay, logger and envs in separate workers.

    env workers ──act(obs)──► agent: actor thread ──add_batch──► replay
               ◄──actions───         (batches envs)  ──tran─────► logger
                                    learner thread ◄─sample_batch_*─ replay
                                                   ──update───────►
                                                   ──add(metrics)─► logger
    launcher (`combined`): starts the workers, decides stop and save, prints
    progress.

One module per role, each opening with its loop and the RPC methods it
serves and calls; each role's logic is an object whose methods are its RPC
methods, and the module's tail binds it to a server:

    launch.py          combined: the launcher, stop and save protocol
    agent.py           parallel_agent, AgentControl: the agent process
    actor.py           parallel_actor, ActorRole: serves `act`
    learner.py         parallel_learner: trains from the replay's batches
    replay_server.py   parallel_replay, ReplayRole: replays and the limiter
    logger_server.py   parallel_logger, LoggerRole: the global step, metrics
    env.py             parallel_env, parallel_envs: env worker processes

and their helpers: `link` (what actor and learner share, each field with
its lock), `envpool` (restarting env workers), `remote_stream` (the
learner's batch stream).

Who serves each RPC method (one server per process, at its address):

    address           method                          served by       caller
    run.actor_addr    act                             ActorRole.act,  env workers
                                                      then .send
                      status pause resume drained     AgentControl    launcher
                      save stop_learner stop_envs
                      shutdown
    run.replay_addr   add_batch                       ReplayRole      actor
                      sample_batch_train/_report/     ReplayRole      learner
                      _eval, update
                      status save release             ReplayRole      launcher
                      shutdown                        parallel_replay launcher
    run.logger_addr   tran                            LoggerRole      actor
                      add                             LoggerRole      learner,
                                                                      replay
                      abandon status save             LoggerRole      launcher
                      replica_steps                   LoggerRole      learner
                                                                      (replicas)
                      shutdown                        parallel_logger launcher

Which thread of the agent process calls each agent method:

    agent method                   thread
    init_policy                    actor thread, once after the barrier
    policy                         the `act` server's workers
                                   (run.actor_threads of them)
    load (restore)                 learner thread, before the barrier
    init_train, init_report,       learner thread
    stream, train, report,
    policy_lag
    save                           the `save` server thread (AgentControl),
                                   under link.train_lock, never during
                                   train or report

Entry points keep the original's signatures. Every factory may be given as
a callable or as its cloudpickled bytes. `python -m embodied.run.parallel`
takes the same flags as `python -m embodied.main`.
"""

from embodied.run.parallel.actor import ActorRole
from embodied.run.parallel.actor import parallel_actor
from embodied.run.parallel.agent import AgentControl
from embodied.run.parallel.agent import parallel_agent
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
