"""The learner's stream of batches from the replay process."""

import collections
import functools
import time

import elements

from embodied import rpc
from embodied.run import connections


class RemoteStream:
    """Batches from the replay's `sample_batch_<source>`, requested
    `prefetch` ahead from the start. Ends (StopIteration) when `stop` is set
    or the replay shuts down. `count(key, amount=1)` adds to the learner's
    progress counters (`AgentLink.count`).

    With `shared`, once the first batch has shown the layout, batches come
    through shared-memory slots when the replay is on this machine
    (`rpc.channel`, `per_request` batches a round trip)."""

    def __init__(self, args, source, stop, count, prefetch=4,
                 shared=False, per_request=None):
        self.source, self.stop, self.count = source, stop, count
        self.client = connections.connect(
            args, 'replay', f'LearnerReplay{source.title()}')
        self.channel = rpc.channel.Consumer(
            functools.partial(self.client.call, f'sample_batch_{source}'),
            f'Learner: {source} batches', shared, prefetch, per_request,
            functools.partial(count, f'{source}_shared_batches'),
            args.replay_addr)
        self.futures = collections.deque(
            self.channel.request() for _ in range(prefetch))
        self.ready = collections.deque()  # Batches received, not yet used.
        self.received = 0
        self.report_every = args.wait_report
        self.addr = args.replay_addr

    def _report(self):
        return (f'Learner: waiting for a {self.source} batch from the replay '
                f'at {self.addr} ({self.received} received so far; the '
                f'replay reports its limiter and fill state while it waits)')

    def ready_soon(self):
        """Whether a batch has arrived (so `next` will not wait long)."""
        return (self.received > 0 or bool(self.ready) or
                self.futures[0].future.done())

    def __iter__(self):
        return self

    def __next__(self):
        if not self.ready:
            self._fetch()
        self.received += 1
        return self.ready.popleft()

    def _fetch(self):
        pending = self.futures.popleft()
        start = time.monotonic()
        with elements.timer.section(f'stream_{self.source}_response'):
            data = rpc.result(
                pending.future, self.stop,
                report_every=self.report_every, report=self._report)
        self.count(f'{self.source}_wait_seconds', time.monotonic() - start)
        batches = self.channel.receive(pending, data)
        if batches is None:
            raise StopIteration
        self.ready.extend(batches)
        # Asked after the slots of this reply are read, so that they count
        # as in use while the new request takes its slots.
        self.futures.append(self.channel.request())

    def close(self):
        self.channel.close()
        self.client.close(1)
