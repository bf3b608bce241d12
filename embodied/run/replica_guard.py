"""A replica's command as a small parent that watches the process doing
the work, so that its exit always names a lost replica.

When a replica dies, the collectives library (gloo), or JAX's
coordination client when replica 0 (the coordinator) is the one lost, can
end a survivor itself with SIGABRT (exit code -6) a moment after the loss,
before the survivor's own watchdog names the lost replica; JAX has no
option that makes gloo raise instead, and `jax_enable_recoverability`
does not keep its client from aborting either. So the command of a replica
runs the same command line again as a child and relays its stderr; when
the child ends by a signal after gloo or JAX reported a lost peer, the parent
prints the line naming the lost replica and exits with `EXIT_LOST` (1),
the code of the child's own line for a lost replica.

    code = replica_guard.supervise(config)   # in the command's process
    replica_guard.is_child()                  # in the child

SIGTERM sent to the parent alone is passed on (a stop with a final save);
SIGINT reaches the child from the terminal's process group. The child ends
with the parent (`rpc.workers.die_with_parent`).
"""

import collections
import os
import signal
import subprocess
import sys
import threading

from embodied.run.parallel import remote_roles

ENV_VAR = 'EMBODIED_REPLICA_CHILD'
EXIT_LOST = 1
# What gloo, or JAX's coordination client, writes to stderr before it
# ends the process for a lost peer.
_LOST_MARKERS = ('gloo', 'Gloo', 'JAX distributed service detected fatal')
_TAIL = 200  # Lines of the child's stderr kept to find them.


def is_child():
    return os.environ.get(ENV_VAR) == str(os.getppid())


def child_setup():
    """In the child: ends it when the parent ends (a SIGKILL of the
    replica's command must not leave the work running)."""
    from embodied.rpc import workers
    workers.die_with_parent(os.getppid())


def supervise(config, argv=None, command=None):
    """Runs this command again (or `command`) as a child and returns the
    exit code for this process: the child's, or `EXIT_LOST` after naming
    the lost replica when gloo or JAX ended the child."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = command or [sys.executable, *remote_roles.program(), *argv]
    env = dict(os.environ, **{ENV_VAR: str(os.getpid())})
    child = subprocess.Popen(command, env=env, stderr=subprocess.PIPE)
    tail = collections.deque(maxlen=_TAIL)
    relay = threading.Thread(
        target=_relay, args=(child.stderr, tail), daemon=True)
    relay.start()
    previous = signal.signal(
        signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))
    # Ctrl-C reaches the child through the terminal; the parent waits.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        code = child.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
    relay.join(timeout=5)
    if code >= 0:
        return code
    text = ''.join(tail)
    if not any(marker in text for marker in _LOST_MARKERS):
        return 128 - code  # Killed by a signal: the shell's convention.
    print(lost_message(config, code), file=sys.stderr, flush=True)
    return EXIT_LOST


def lost_message(config, code):
    """The line for a child that gloo ended by signal `-code`."""
    index, count = int(config.replica), int(config.replicas)
    others = [i for i in range(count) if i != index]
    who = (f'replica {others[0]} of {count} was lost' if len(others) == 1
           else f'another replica of {count} was lost (gloo does not say '
                f'which)')
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f'signal {-code}'
    return (f'Replica {index}: {who}; the collectives library (gloo) or '
            f'JAX\'s coordination client ended this replica by {name} (exit '
            f'code {code}) when it lost the connection. Start every replica '
            f'again to resume from the last save all of them hold.')


def _relay(stream, tail):
    for line in iter(stream.readline, b''):
        text = line.decode('utf-8', 'replace')
        tail.append(text)
        sys.stderr.write(text)
        sys.stderr.flush()
    stream.close()

