"""The RPC layer of the parallel runner, on top of portal.

* `auth`: the run's secret in the handshake; control methods for the
  launcher only.
* `addresses`: bind hosts (loopback unless named) and distinct free ports.
* `sockets`: portal's server socket, hardened against malformed peers.
* `server`: a single-process RPC server with batching and partial flushes.
* `client`: portal's client on an event-driven socket loop; bounded
  connects and interruptible waits.
* `slots`: large replies through shared memory on one machine.
* `sync_client`: a client without a thread, for one call at a time.
* `wire`: portal's message encoding with less CPU.
* `workers`: processes and threads for the roles of a launch.
* `supervisor`: starts the workers of a launch together and watches them.
"""

from . import addresses
from . import auth
from . import client
from . import server
from . import slots
from . import sockets
from . import supervisor
from . import sync_client
from . import workers
from .addresses import PortTaken
from .client import BadRequest, Client, RemoteError, Unreachable, connect, result
from .server import Server
from .supervisor import Supervisor, WorkerFailed
from .sync_client import SyncClient
from .workers import Process, Thread
