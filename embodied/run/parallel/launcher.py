"""The launcher: `combined`, the command's own process, starts every role
and alone decides stop and save.

    combined(make_agent, make_replay_train, make_replay_eval, make_env_train,
             make_env_eval, make_stream, make_logger, args):
        start workers: Agent (actor + learner), Logger, Replay, env workers
        connect to logger, replay, actor
        first save (a fresh run), then until run.steps / run.duration / a signal:
            read the logger's step; every run.save_every: save; print progress
        stop: drain, stop the learner, release the replay, final save,
              stop the envs, the agent, the replay, the logger; every
              worker exits 0

The lifecycle, its states and the order of the stop are lifecycle.py's
(`Launcher`, the state machine `combined` runs); every role serves the same
control methods (control.py).
Crashed env workers restart (`env.pool`); an env error a restart cannot
fix stops the run in order with a save, then raises `rpc.WorkerFailed`
naming the worker. With run.auth the launcher hands its workers the data
token only and alone holds the control token (`rpc.auth`,
`remote_roles.credentials`). SIGTERM to any process of the run asks for a
stop with a final save (workers ignore it and SIGINT).

RPC methods called: those of lifecycle.py.
"""

import multiprocessing
import sys

from embodied import rpc
from embodied.run import arguments
from embodied.run import ending
from embodied.run.parallel import roles
from embodied.run import saving
from embodied.run import validation
from embodied.run.parallel import connections
from embodied.run.parallel import lifecycle
from embodied.run.parallel import remote_roles

PORT_ATTEMPTS = 3


@ending.in_one_line
def combined(
        make_agent, make_replay_train, make_replay_eval, make_env_train,
        make_env_eval, make_stream, make_logger, args):
    """Runs the whole training launch until it stops; see the module doc.
    Workers are spawned and import the calling script again, so a script
    calls `combined` under `if __name__ == '__main__':` (without the guard,
    the workers end at once with an error saying so)."""
    _refuse_in_spawned_worker()
    args = arguments.normalize(args)
    validation.check_parallel(args)
    factories = dict(
        agent=make_agent, replay_train=make_replay_train,
        replay_eval=make_replay_eval, env_train=make_env_train,
        env_eval=make_env_eval, stream=make_stream, logger=make_logger)
    factories = {k: connections.dumps(v) for k, v in factories.items()}
    origin = remote_roles.secret_origin(args)
    creds = remote_roles.credentials(args, origin)
    for line in remote_roles.start_lines(args, origin):
        print(line, flush=True)
    if creds:  # The workers get the data token, never the control token.
        args = args.update(secret=creds.for_workers().encode())
    if args.get('from_checkpoint') and saving.resume_tag(args.logdir, report=False) is None:
        saving.agent_save_folder(args.from_checkpoint)
    saving.refuse_pickles(args)  # Before any worker starts.
    auto = any('{auto}' in str(args[k]) for k in roles.ADDR_KEYS)
    for attempt in range(PORT_ATTEMPTS):
        filled = rpc.addresses.fill_auto(
            {k: args[k] for k in roles.ADDR_KEYS}, connections.ipv6(args),
            avoid=_coordinator_port(args))
        launch = lifecycle.Launcher(
            factories, args.update(filled),
            handshake=creds and creds.handshake(control=True),
            secret_origin=origin)
        try:
            return launch.run()
        except rpc.WorkerFailed as e:
            if not auto or e.exitcode != rpc.supervisor.EXIT_PORT_TAKEN:
                raise
            if attempt + 1 == PORT_ATTEMPTS:
                raise
            print(f'{e} Retrying with other ports.', flush=True)


def _coordinator_port(args):
    """The port of JAX's coordinator when this launch's agent may serve it
    (replica 0 binds it only once the agent is being built, after the
    launcher chose its `{auto}` ports): a port taken by both would end
    every replica."""
    address = args.get('coordinator_address')
    if args.replicas <= 1 or not address:
        return ()
    try:
        return (rpc.addresses.split(address)[1],)
    except ValueError:
        return ()  # The agent names the bad address when it joins.


def _refuse_in_spawned_worker():
    # True while a spawned child imports its parent's script (the flag that
    # multiprocessing's own bootstrapping check reads).
    if getattr(multiprocessing.current_process(), '_inheriting', False):
        main = sys.modules.get('__mp_main__')
        raise RuntimeError(
            f"combined() was called while a worker process was starting: "
            f"the script {getattr(main, '__file__', '')} calls it at import "
            f"time. Workers are spawned and import the script again, so "
            f"call combined() under `if __name__ == '__main__':`.")
