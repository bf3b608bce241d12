"""The RPC layer of the parallel runner, on top of portal.

Why on portal's internals, and why portal is pinned (pyproject.toml,
`portal==3.8.3`): the layer keeps portal's protocol (handshake, frames,
request numbers, wire encoding), so the original's env processes and any
`portal.Client` talk to our servers, and it replaces the parts of portal
that cost a small machine most: the client socket's loop (portal's keeps
polling while idle, ours sleeps; a run holds a dozen clients) and the
encoder (figures in docs/benchmarks.md, "Figures behind settings in the
code"). That needs portal's private classes
(`ClientSocket._loop`, `ServerSocket._recv`/`_handshake`, the attributes
`portal.Client.__init__` sets, `packlib`), which a portal release may change
without notice. Owning the whole protocol would mean rewriting sockets,
reconnects and futures that portal gets right; a pin is the smaller
contract. `tests/rpc/test_portal_contract.py` names every private symbol
used and checks the installed portal is the pinned one: moving the pin
starts there.

* `auth`: the run's secret in the handshake, the server's verdict on it;
  control methods for the launcher only.
* `backoff`: growing waits between reconnects, rate-limited reports.
* `addresses`: bind hosts (loopback unless named) and distinct free ports.
* `sockets`: portal's server socket, hardened against malformed peers.
* `server`: a single-process RPC server with batching and partial flushes.
* `client`: portal's client on an event-driven socket loop, bounded
  connects and interruptible waits; `SyncClient`, without a thread, for
  one call at a time.
* `actor_to_replay`: the actor's writer to the replay: joins sends while
  the replay is busy, with back-pressure.
* `replay_to_learner`: the replay's batches to the learner: the learner
  names shared-memory slots, the replay fills them in place, the socket
  where slots cannot be used.
* `shared_params`: parameters from one process to another on the same
  machine (the learner's to the policy process): a generation-counted
  double buffer in one file under /dev/shm.
* `shm_files`: files in /dev/shm named by the pid of their maker, so that
  the next process removes those a dead process left behind.
* `status`: the status codes of replies, for servers and clients.
* `wire`: portal's message encoding with less CPU.
* `workers`: processes and threads for the roles of a launch.
* `supervisor`: starts the workers of a launch together and watches them;
  restarts crashed ones with back-off.
"""

from . import actor_to_replay
from . import addresses
from . import auth
from . import backoff
from . import client
from . import replay_to_learner
from . import server
from . import sockets
from . import status
from . import supervisor
from . import workers
from .addresses import PortTaken
from .client import (
    BadRequest, Client, Refused, RemoteError, SyncClient, Unreachable,
    connect, result)
from .server import Server
from .supervisor import Supervisor, WorkerFailed
from .workers import Process, Thread
