"""Adaptive concurrency limits for a bulkhead: Netflix concurrency-limits' ``Gradient2Limit`` and ``AIMDLimit``.

A fixed ``max_concurrent_calls`` applies Little's law (in flight = throughput x latency) once, by hand; it is
wrong as soon as the dependency slows down. With ``"adaptive"`` the bulkhead starts at ``max_concurrent_calls``
and moves its limit after every completed call from the call's latency (and whether it was a *drop*: an
exception of ``drop_exceptions``, or for AIMD a latency above ``timeout``), within ``[min_limit, max_limit]``.

``gradient2`` (Netflix's default): compares each call's latency (short RTT) with an exponential average over
``long_window`` samples (long RTT). ``gradient = clamp(rtt_tolerance * long / short, 0.5, 1)``; the new estimate
is ``limit * gradient + queue_size``, smoothed: ``limit * (1 - smoothing) + estimate * smoothing``. Latency
rising above ``rtt_tolerance`` x the baseline shrinks the limit (at most by half per step); otherwise it grows by
up to ``queue_size``. The limit does not move while fewer than half of it are in flight (the caller, not the
dependency, is the bottleneck). When the long RTT is more than twice the short one (latency came back down) the
long RTT decays 5 % per sample so the baseline follows quickly.

``aimd``: additive increase (+1 while at least half of the limit is in flight), multiplicative decrease
(``limit * backoff_ratio``) on a drop or a latency above ``timeout``.

Differences from Netflix: each completed call is one sample (no ``WindowedLimit`` aggregation wrapped around
the algorithm); ``inflight`` is the number of calls holding a permit when the call completes (Netflix passes the
count at acquire time); Gradient2 ignores drops, as Netflix's does. Defaults are Netflix's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .config import Validator

__all__ = [
    "AIMD",
    "ALGORITHMS",
    "GRADIENT2",
    "AIMDLimit",
    "AdaptiveLimitConfig",
    "Gradient2Limit",
    "WindowedLimit",
    "make_limit",
]

GRADIENT2 = "gradient2"
AIMD = "aimd"
#: The algorithms ``adaptive["algorithm"]`` accepts.
ALGORITHMS = (GRADIENT2, AIMD)


@dataclass(frozen=True, slots=True)
class AdaptiveLimitConfig:
    """The ``adaptive`` option of a bulkhead. Defaults are Netflix concurrency-limits' builders'."""

    algorithm: str = GRADIENT2
    min_limit: int = 20
    max_limit: int = 200
    #: Gradient2: how much of each new estimate enters the limit (0 < x <= 1).
    smoothing: float = 0.2
    #: Gradient2: how much the limit may grow per sample while latency stays low.
    queue_size: int = 4
    #: Gradient2: samples averaged into the baseline (long) RTT.
    long_window: int = 600
    #: Gradient2: latency may rise to this multiple of the baseline before the limit shrinks (>= 1).
    rtt_tolerance: float = 1.5
    #: AIMD: the limit is multiplied by this on a drop (0.5 <= x < 1).
    backoff_ratio: float = 0.9
    #: AIMD: a call slower than this counts as a drop.
    timeout: Any = "5s"
    #: Exceptions that count as drops (empty: every ``Exception``). Gradient2 ignores drops.
    drop_exceptions: Any = ()
    #: Netflix's ``WindowedLimit`` around the algorithm: one sample per window (average latency, most in flight,
    #: any drop) instead of one per call.
    windowed: bool = False
    #: With ``windowed``: a window closes after at least this many calls ...
    window_size: int = 10
    #: ... and after twice its fastest call, kept within these bounds (Netflix: 1 s and 1 s).
    min_window_time: Any = "1s"
    max_window_time: Any = "1s"

    def __post_init__(self) -> None:
        v = Validator(self)
        algorithm = self.algorithm
        if isinstance(algorithm, str) and algorithm.lower() in ALGORITHMS:
            object.__setattr__(self, "algorithm", algorithm.lower())
        else:
            v.error("algorithm", f"must be one of {', '.join(repr(a) for a in ALGORITHMS)}, got {algorithm!r}")
        v.integer("min_limit", minimum=1)
        v.integer("max_limit", minimum=1)
        if isinstance(self.min_limit, int) and isinstance(self.max_limit, int) and self.max_limit < self.min_limit:
            v.error("max_limit", f"must be >= min_limit ({self.min_limit}), got {self.max_limit}")
        v.number("smoothing", gt=0, le=1)
        v.integer("queue_size", minimum=0)
        v.integer("long_window", minimum=1)
        v.number("rtt_tolerance", ge=1)
        v.number("backoff_ratio", ge=0.5)
        if isinstance(self.backoff_ratio, float) and self.backoff_ratio >= 1:
            v.error("backoff_ratio", f"must be < 1, got {self.backoff_ratio:g}")
        v.duration("timeout", min_ns=1)
        v.exception_classes("drop_exceptions")
        v.boolean("windowed")
        v.integer("window_size", minimum=10)
        v.duration("min_window_time", min_ns=100_000_000)
        v.duration("max_window_time", min_ns=100_000_000)
        v.done()


class Gradient2Limit:
    """Netflix's ``Gradient2Limit._update`` over one sample per completed call (not thread-safe: the bulkhead
    calls it under its lock)."""

    __slots__ = ("_count", "_long_rtt", "_sum", "cfg", "estimated_limit", "limit")

    def __init__(self, initial_limit: int, cfg: AdaptiveLimitConfig) -> None:
        self.cfg = cfg
        self.estimated_limit = float(initial_limit)
        self.limit = initial_limit
        self._long_rtt = 0.0  # ExpAvgMeasurement(long_window, warmup 10)
        self._sum = 0.0
        self._count = 0

    def _add_long(self, rtt: float) -> float:
        if self._count < 10:  # warm-up: a plain mean of the first 10 samples
            self._count += 1
            self._sum += rtt
            self._long_rtt = self._sum / self._count
        else:
            factor = 2.0 / (self.cfg.long_window + 1)
            self._long_rtt = self._long_rtt * (1 - factor) + rtt * factor
        return self._long_rtt

    def update(self, rtt_ns: int, inflight: int, dropped: bool, end_ns: int = 0) -> int:
        """The new limit after one call that took ``rtt_ns`` with ``inflight`` calls holding permits."""
        cfg = self.cfg
        estimated = self.estimated_limit
        short_rtt = float(max(rtt_ns, 1))
        long_rtt = self._add_long(short_rtt)
        if long_rtt / short_rtt > 2:  # latency came back down: let the baseline follow fast
            self._long_rtt *= 0.95
        if inflight < estimated / 2:  # app-limited: do not grow (or shrink) on so little load
            return self.limit
        gradient = max(0.5, min(1.0, cfg.rtt_tolerance * long_rtt / short_rtt))
        new_limit = estimated * gradient + cfg.queue_size
        new_limit = estimated * (1 - cfg.smoothing) + new_limit * cfg.smoothing
        new_limit = max(cfg.min_limit, min(cfg.max_limit, new_limit))
        self.estimated_limit = new_limit
        self.limit = int(new_limit)
        return self.limit


class AIMDLimit:
    """Netflix's ``AIMDLimit._update`` (not thread-safe: the bulkhead calls it under its lock)."""

    __slots__ = ("_timeout_ns", "cfg", "limit")

    def __init__(self, initial_limit: int, cfg: AdaptiveLimitConfig) -> None:
        self.cfg = cfg
        self.limit = initial_limit
        self._timeout_ns = int(cfg.timeout)

    def update(self, rtt_ns: int, inflight: int, dropped: bool, end_ns: int = 0) -> int:
        """The new limit after one call: x ``backoff_ratio`` on a drop or timeout, +1 when half-used or more."""
        limit = self.limit
        if dropped or rtt_ns > self._timeout_ns:
            limit = int(limit * self.cfg.backoff_ratio)
        elif inflight * 2 >= limit:
            limit += 1
        self.limit = min(self.cfg.max_limit, max(self.cfg.min_limit, limit))
        return self.limit


class WindowedLimit:
    """Netflix's ``WindowedLimit`` with its average sample window: the wrapped algorithm sees one sample per
    window (mean latency, most calls in flight, whether any call dropped). A window closes at the first call
    ending after ``2 x its fastest call`` (clamped to ``min_window_time``..``max_window_time``) and counts only
    with ``window_size`` calls or more. Calls faster than 100 µs are ignored, as in Netflix's."""

    __slots__ = ("_count", "_delegate", "_drop", "_max_inflight", "_min_rtt", "_next_update", "_sum", "cfg")

    def __init__(self, delegate: Gradient2Limit | AIMDLimit, cfg: AdaptiveLimitConfig) -> None:
        self.cfg = cfg
        self._delegate = delegate
        self._next_update = 0
        self._clear()

    def _clear(self) -> None:
        self._min_rtt = 0
        self._sum = 0
        self._count = 0
        self._max_inflight = 0
        self._drop = False

    @property
    def limit(self) -> int:
        """The wrapped algorithm's current limit."""
        return self._delegate.limit

    def update(self, rtt_ns: int, inflight: int, dropped: bool, end_ns: int = 0) -> int:
        """Add one call (ending at ``end_ns``); feed the algorithm when the window closes."""
        if rtt_ns < 100_000:
            return self._delegate.limit
        self._min_rtt = rtt_ns if self._count == 0 else min(self._min_rtt, rtt_ns)
        self._sum += rtt_ns
        self._count += 1
        self._max_inflight = max(self._max_inflight, inflight)
        self._drop = self._drop or dropped
        if end_ns > self._next_update:
            cfg = self.cfg
            span = min(max(self._min_rtt * 2, int(cfg.min_window_time)), int(cfg.max_window_time))
            self._next_update = end_ns + span
            ready = self._count >= cfg.window_size
            mean, most, drop = self._sum // max(self._count, 1), self._max_inflight, self._drop
            self._clear()
            if ready:
                return self._delegate.update(mean, most, drop)
        return self._delegate.limit


def make_limit(cfg: AdaptiveLimitConfig, initial_limit: int) -> Gradient2Limit | AIMDLimit | WindowedLimit:
    """The algorithm ``cfg`` names, starting at ``initial_limit`` (inside a :class:`WindowedLimit` if asked)."""
    limit: Gradient2Limit | AIMDLimit = (
        AIMDLimit(initial_limit, cfg) if cfg.algorithm == AIMD else Gradient2Limit(initial_limit, cfg)
    )
    return WindowedLimit(limit, cfg) if cfg.windowed else limit
