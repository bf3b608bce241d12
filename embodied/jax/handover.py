"""The policy's parameters, handed from the learner thread to the actor
thread(s) without either waiting for the other."""

import threading

import jax


class PolicyParams:
    """The parameters the policy acts with, and a newer copy on its way.

    The learner `offer()`s a copy after an update (a device copy it only
    dispatches; nothing waits). The actor calls `acting()` at each policy
    call: it swaps in the offered copy once the device has finished it, and
    until then keeps acting with the previous one, so a policy call never
    queues behind an update. While an offered copy is still being made,
    later offers are skipped (at most one copy in flight); a finished copy
    the actor has not taken yet becomes the acting one at the next offer, so
    the acting parameters are never older than the newest finished copy.

    Versions count updates: `acting(latest)` records how many updates old
    the acting parameters are, summarised by `lag()` (as Sample Factory's
    `version_diff`).
    """

    def __init__(self, params, version=0):
        self._lock = threading.Lock()
        self._params, self._version = params, version
        self._pending = None  # (version, params)
        self._lags = [0, 0, 0]  # sum, count, max since the last lag()

    def replace(self, params, version):
        """Acts with `params` from the next policy call on, ready or not
        (after a load, the old parameters must not act again)."""
        with self._lock:
            self._params, self._version = params, version
            self._pending = None

    def offer(self, make_params, version):
        """Offers `make_params()` unless an earlier offer is still being made
        on the device (then `make_params` is not called). An earlier offer
        that is ready but not yet taken acts from now on. Returns whether it
        offered."""
        with self._lock:
            if self._pending is not None:
                if not _ready(self._pending[1]):
                    return False
                self._version, self._params = self._pending
                self._pending = None
        params = make_params()
        with self._lock:
            self._pending = (version, params)
        return True

    def acting(self, latest=None):
        """The parameters to act with now; `latest` is the learner's update
        count, to record the lag."""
        with self._lock:
            if self._pending is not None and _ready(self._pending[1]):
                self._version, self._params = self._pending
                self._pending = None
            if latest is not None:
                lag = max(0, latest - self._version)
                self._lags[0] += lag
                self._lags[1] += 1
                self._lags[2] = max(self._lags[2], lag)
            return self._params

    def newest(self):
        """The newest parameters, offered or acting (neither swaps nor waits)."""
        with self._lock:
            return self._pending[1] if self._pending else self._params

    def latest(self):
        """(version, parameters) of the newest copy, offered or acting
        (neither swaps nor waits)."""
        with self._lock:
            return self._pending or (self._version, self._params)

    @property
    def version(self):
        return self._version

    def lag(self):
        """{'policy_lag/mean', 'policy_lag/max'} over the policy calls since
        the last `lag()`, in updates; empty when there were none."""
        with self._lock:
            (total, count, most), self._lags = self._lags, [0, 0, 0]
        if not count:
            return {}
        return {'policy_lag/mean': total / count, 'policy_lag/max': most}


def _ready(tree):
    return all(
        x.is_ready() for x in jax.tree.leaves(tree) if hasattr(x, 'is_ready'))
