"""The parallel runner: agent, replay, logger and envs in separate workers.

    env workers ──act(obs)──► agent: actor thread ──add_batch──► replay
               ◄──actions───         (batches envs)  ──tran─────► logger
                                    learner thread ◄─sample_batch_*─ replay
                                                   ──update───────►
                                                   ──add(metrics)─► logger
    launcher (`combined`): starts the workers, decides stop and save, prints
    progress.

One module per role, each opening with its loop and the RPC methods it
serves and calls:

    launch.py          combined: the launcher, stop and save protocol
    agent.py           parallel_agent: the process of the actor and learner
    actor.py           parallel_actor: serves `act` to the env workers
    learner.py         parallel_learner: trains from the replay's batches
    replay_server.py   parallel_replay: replays and the train-ratio limiter
    logger_server.py   parallel_logger: the global step and metrics
    env.py             parallel_env, parallel_envs: env worker processes

and their helpers: `link` (what actor and learner share), `envpool`
(restarting env workers), `remote_stream` (the learner's batch stream).

Entry points keep the original's signatures. Every factory may be given as
a callable or as its cloudpickled bytes. `python -m embodied.run.parallel`
takes the same flags as `python -m embodied.main`.
"""

from embodied.run.parallel.actor import parallel_actor
from embodied.run.parallel.agent import parallel_agent
from embodied.run.parallel.env import parallel_env
from embodied.run.parallel.env import parallel_envs
from embodied.run.parallel.launch import combined
from embodied.run.parallel.learner import parallel_learner
from embodied.run.parallel.logger_server import parallel_logger
from embodied.run.parallel.replay_server import add_rows
from embodied.run.parallel.replay_server import parallel_replay
from embodied.run.saving import resume_tag
