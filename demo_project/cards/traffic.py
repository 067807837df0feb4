"""What this worker answered on the authorization endpoints, second by second: the dashboard's charts.

Counted on the server, for every client (the dashboard, ``load.py``, curl, a test), so the charts show
the server's traffic and not only the page's own requests. Like the limiters of the in-memory backend
the counts are per process; the dashboard adds up the workers it has heard from. Nothing here knows a
client: only outcomes and ``Retry-After`` values are kept.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["KINDS", "TrafficCounter"]

#: Outcomes, in the order the chart stacks them: 200 APPROVED, 200 DECLINED (the fallback), 429, 503, rest.
KINDS = ("approved", "declined", "429", "503", "other")


class TrafficCounter:
    """Responses per outcome for each of the last ``seconds`` wall-clock seconds, and ``Retry-After`` values.

    :param seconds: how many past seconds to keep (the dashboard's charts show 60).
    :param clock: seconds since the epoch (``time.time``: seconds line up across workers; tests pass a fake).
    """

    def __init__(self, seconds: int = 60, clock: Callable[[], float] = time.time) -> None:
        self._seconds = seconds
        self._clock = clock
        self._lock = threading.Lock()  # held for a few dict operations, never while waiting
        self._per_second: dict[int, dict[str, int]] = {}
        self._retry_after: dict[int, dict[str, int]] = {}
        self._totals = dict.fromkeys(KINDS, 0)

    def count(self, kind: str, retry_after: str | None = None) -> None:
        """One response of ``kind`` (one of :data:`KINDS`), with its ``Retry-After`` header if it had one."""
        second = int(self._clock())
        with self._lock:
            bucket = self._per_second.get(second)
            if bucket is None:
                self._forget(second)
                bucket = self._per_second[second] = dict.fromkeys(KINDS, 0)
            bucket[kind] += 1
            self._totals[kind] += 1
            if retry_after is not None:
                values = self._retry_after.setdefault(second, {})
                values[retry_after] = values.get(retry_after, 0) + 1

    def _forget(self, now: int) -> None:
        oldest = now - self._seconds
        for table in (self._per_second, self._retry_after):
            for second in [s for s in table if s <= oldest]:
                del table[second]

    def snapshot(self) -> dict[str, object]:
        """``{"now", "window_s", "per_second": {"<epoch second>": {kind: n}}, "retry_after": {value: n},
        "totals": {kind: n}}``: the window's seconds that saw traffic, ``Retry-After`` values counted
        over the window, and totals since the process started."""
        now = int(self._clock())
        with self._lock:
            self._forget(now)
            retry: dict[str, int] = {}
            for values in self._retry_after.values():
                for value, n in values.items():
                    retry[value] = retry.get(value, 0) + n
            return {
                "now": now,
                "window_s": self._seconds,
                "per_second": {str(s): dict(c) for s, c in sorted(self._per_second.items())},
                "retry_after": retry,
                "totals": dict(self._totals),
            }
