"""What the partner sees from the whole deployment (``make demo-cluster``): calls in flight at once, and the peak.

The partner contract of the demo is "at most N concurrent calls from all our instances". The acquirer's
bulkhead is then cluster-wide (its slots are leases in Redis), and this meter is the partner's side of the
story: every call that reaches the simulated partner, from any worker of any host, is counted in Redis
(``INCR`` / ``DECR``), and the highest count ever seen is kept. ``peak <= N`` is the contract holding.
"""

from __future__ import annotations

import contextlib
from typing import Any

__all__ = ["ClusterMeter"]

# KEYS: in flight, peak. Both expire a day after the last call (the demo leaves nothing behind for long).
_ENTER = """
local n = redis.call('INCR', KEYS[1])
local peak = tonumber(redis.call('GET', KEYS[2]) or '0')
if n > peak then redis.call('SET', KEYS[2], n) end
redis.call('EXPIRE', KEYS[1], 86400)
redis.call('EXPIRE', KEYS[2], 86400)
return n
"""


class ClusterMeter:
    """Calls in flight at the partner from every worker of every host, counted in Redis.

    :param url: the Redis URL; :param prefix: the keys' prefix (one meter per demo).
    """

    def __init__(self, url: str, prefix: str) -> None:
        import redis

        self._client: Any = redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)
        self._keys = [f"{prefix}:partner:in_flight", f"{prefix}:partner:peak"]
        self._enter = self._client.register_script(_ENTER)

    def enter(self) -> None:
        """A call reaches the partner (never fails the call: the meter is for the dashboard)."""
        with contextlib.suppress(Exception):
            self._enter(keys=self._keys)

    def leave(self) -> None:
        """A call to the partner ended."""
        with contextlib.suppress(Exception):
            self._client.decr(self._keys[0])

    def snapshot(self) -> dict[str, int]:
        """``{"in_flight": ..., "peak": ...}`` as Redis has them now (zeros if it cannot be read)."""
        try:
            in_flight, peak = self._client.mget(self._keys)
        except Exception:
            return {"in_flight": 0, "peak": 0}
        return {"in_flight": int(in_flight or 0), "peak": int(peak or 0)}

    def reset(self) -> None:
        """Forget the peak (and the count) now."""
        with contextlib.suppress(Exception):
            self._client.delete(*self._keys)
