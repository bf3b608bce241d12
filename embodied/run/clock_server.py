"""The clock server of `embodied.clock.setup`, over the RPC layer.

In a multi-replica script of one's own, replica 0 serves the decisions of
the `GlobalClock`s (a `clock.Decider`) and every replica, replica 0 too,
asks it. `core/clock.py` decides but does not reach up to the RPC layer:
`embodied.run` installs `connect` there (`clock.connect_with`). The
runners do not use it: joined replicas take their clock decisions from
JAX's coordinator (`embodied.jax.distributed.ClockLink`).
"""

import portal

from embodied import rpc
from embodied.core import clock


def connect(is_server, replica, replicas, port, addr, timeout):
    """A link for `clock.use` to the clock server at `addr`, which this
    replica first starts on `port` when `is_server`; see `clock.setup`."""
    server = _serve(port, replicas, timeout) if is_server else None
    try:
        client = rpc.connect(addr, f'ClockClient{replica}', timeout)
    except BaseException:
        server and server.close()
        raise
    return RpcLink(client, server, replica, timeout)


class RpcLink:
    """Decisions from the clock server; closing it stops the server too,
    where this replica serves it."""

    def __init__(self, client, server, replica, timeout):
        self.client, self.server = client, server
        self.replica, self.timeout = replica, timeout

    def create(self, every, first):
        return self._ask('create', self.replica, every, first)

    def should(self, clockid, skip):
        return self._ask('should', self.replica, clockid, skip)

    def close(self):
        self.client.close(1)
        if self.server:
            self.server.close()

    def _ask(self, method, *args):
        # The server gives up after `timeout`; the margin covers the round
        # trip.
        future = self.client.call(method, *args)
        try:
            return rpc.result(future, timeout=self.timeout + 30)
        except TimeoutError:
            raise TimeoutError(
                f'GlobalClock: no {method} decision from the clock server in '
                f'{self.timeout + 30} s.') from None


def _serve(port, replicas, timeout):
    decider = clock.Decider(replicas, timeout)
    ipv6 = portal.context.serverkw.get('ipv6', False)
    server = rpc.Server(port, 'ClockServer', ipv6=ipv6)
    server.bind('create', decider.create)
    # A `should` call blocks until its round is complete; each replica may
    # have calls of several clocks waiting at once (e.g. from two threads).
    server.bind('should', decider.should, workers=4 * replicas)
    return server.start()
