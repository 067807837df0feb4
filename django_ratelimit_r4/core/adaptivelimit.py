"""Adaptive concurrency limits for a bulkhead: Netflix concurrency-limits' ``Gradient2Limit``, ``AIMDLimit`` and
``VegasLimit``, and ``littles_law`` (ours: Little's law applied live, with a probed no-load latency).

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

``vegas``: TCP Vegas's queue estimate, ``limit * (1 - no-load RTT / RTT)``, kept between 3 and 6 log10(limit).

``littles_law``: see :class:`LittlesLawLimit`; the one that settles within 20 % of the Little's-law value within
10 s of a step in the partner's latency (``benchmarks/sim_adaptive.py``). The Netflix algorithms' fixed points
are elsewhere by construction: Gradient2 tolerates ``rtt_tolerance`` x the baseline (a queue), AIMD settles where
calls take ``timeout``, Vegas keeps a few calls queued.

Differences from Netflix: each completed call is one sample (no ``WindowedLimit`` aggregation wrapped around
the algorithm unless ``windowed``); ``inflight`` is the number of calls holding a permit when the call completes
(Netflix passes the count at acquire time); Gradient2 ignores drops, as Netflix's does; ``min_limit``,
``max_limit`` and ``smoothing`` are shared, with Gradient2's defaults. Defaults are otherwise Netflix's.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from .config import Validator

__all__ = [
    "AIMD",
    "ALGORITHMS",
    "GRADIENT2",
    "LITTLES_LAW",
    "VEGAS",
    "AIMDLimit",
    "AdaptiveLimit",
    "AdaptiveLimitConfig",
    "Gradient2Limit",
    "LittlesLawLimit",
    "VegasLimit",
    "WindowedLimit",
    "make_limit",
]

GRADIENT2 = "gradient2"
AIMD = "aimd"
VEGAS = "vegas"
LITTLES_LAW = "littles_law"
#: The algorithms ``adaptive["algorithm"]`` accepts.
ALGORITHMS = (GRADIENT2, AIMD, VEGAS, LITTLES_LAW)


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
    #: Vegas: a new no-load RTT is probed every ``probe_multiplier x limit`` samples (x a jitter of 0.5..1).
    probe_multiplier: int = 30
    #: Little's law: the limit is measured throughput x no-load latency x (1 + headroom).
    headroom: float = 0.1
    #: Little's law: the no-load latency is re-measured (a probe at half the limit) when no window confirmed it
    #: for this long.
    probe_interval: Any = "30s"

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
        v.integer("probe_multiplier", minimum=1)
        v.number("headroom", ge=0, le=1)
        v.duration("probe_interval", min_ns=1_000_000_000)
        v.done()


class Gradient2Limit:
    """Netflix's ``Gradient2Limit._update`` over one sample per completed call (not thread-safe: the bulkhead
    calls it under its lock)."""

    __slots__ = (
        "_count",
        "_factor",
        "_keep",
        "_long_rtt",
        "_max",
        "_min",
        "_queue",
        "_smoothing",
        "_sum",
        "_tolerance",
        "cfg",
        "estimated_limit",
        "limit",
    )

    def __init__(self, initial_limit: int, cfg: AdaptiveLimitConfig) -> None:
        self.cfg = cfg
        self.estimated_limit = float(initial_limit)
        self.limit = initial_limit
        self._long_rtt = 0.0  # ExpAvgMeasurement(long_window, warmup 10)
        self._sum = 0.0
        self._count = 0
        self._factor = 2.0 / (cfg.long_window + 1)
        self._keep = 1.0 - self._factor
        self._tolerance = float(cfg.rtt_tolerance)
        self._queue = float(cfg.queue_size)
        self._smoothing = float(cfg.smoothing)
        self._min = float(cfg.min_limit)
        self._max = float(cfg.max_limit)

    def update(self, rtt_ns: int, inflight: int, dropped: bool, end_ns: int = 0) -> int:
        """The new limit after one call that took ``rtt_ns`` with ``inflight`` calls holding permits."""
        short_rtt = rtt_ns if rtt_ns > 0 else 1
        if self._count < 10:  # warm-up of the long RTT: a plain mean of the first 10 samples
            self._count += 1
            self._sum += short_rtt
            long_rtt = self._long_rtt = self._sum / self._count
        else:
            long_rtt = self._long_rtt = self._long_rtt * self._keep + short_rtt * self._factor
        if long_rtt > 2 * short_rtt:  # latency came back down: let the baseline follow fast
            self._long_rtt = long_rtt * 0.95
        estimated = self.estimated_limit
        if inflight < estimated / 2:  # app-limited: do not grow (or shrink) on so little load
            return self.limit
        gradient = self._tolerance * long_rtt / short_rtt
        if gradient > 1.0:
            gradient = 1.0
        elif gradient < 0.5:
            gradient = 0.5
        smoothing = self._smoothing
        new_limit = estimated * (1 - smoothing) + (estimated * gradient + self._queue) * smoothing
        if new_limit < self._min:
            new_limit = self._min
        elif new_limit > self._max:
            new_limit = self._max
        self.estimated_limit = new_limit
        self.limit = int(new_limit)
        return self.limit


class AIMDLimit:
    """Netflix's ``AIMDLimit._update`` (not thread-safe: the bulkhead calls it under its lock)."""

    __slots__ = ("_backoff", "_max", "_min", "_timeout_ns", "cfg", "limit")

    def __init__(self, initial_limit: int, cfg: AdaptiveLimitConfig) -> None:
        self.cfg = cfg
        self.limit = initial_limit
        self._timeout_ns = int(cfg.timeout)
        self._backoff = cfg.backoff_ratio
        self._min = cfg.min_limit
        self._max = cfg.max_limit

    def update(self, rtt_ns: int, inflight: int, dropped: bool, end_ns: int = 0) -> int:
        """The new limit after one call: x ``backoff_ratio`` on a drop or timeout, +1 when half-used or more."""
        limit = self.limit
        if dropped or rtt_ns > self._timeout_ns:
            limit = int(limit * self._backoff)
            if limit < self._min:
                limit = self._min
        elif inflight * 2 >= limit and limit < self._max:
            limit += 1
        else:
            return limit
        self.limit = limit
        return limit


class WindowedLimit:
    """Netflix's ``WindowedLimit`` with its average sample window: the wrapped algorithm sees one sample per
    window (mean latency, most calls in flight, whether any call dropped). A window closes at the first call
    ending after ``2 x its fastest call`` (clamped to ``min_window_time``..``max_window_time``) and counts only
    with ``window_size`` calls or more. Calls faster than 100 µs are ignored, as in Netflix's."""

    __slots__ = ("_count", "_delegate", "_drop", "_max_inflight", "_min_rtt", "_next_update", "_sum", "cfg")

    def __init__(self, delegate: Gradient2Limit | AIMDLimit | VegasLimit, cfg: AdaptiveLimitConfig) -> None:
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


_LOG10 = [max(1, int(math.log10(i))) if i > 0 else 1 for i in range(1000)]


def _log10_root(value: int) -> int:
    """Netflix's ``Log10RootIntFunction``: ``max(1, int(log10(value)))``."""
    return _LOG10[value] if 0 <= value < 1000 else max(1, int(math.log10(value)))


class VegasLimit:
    """Netflix's ``VegasLimit._update`` (TCP Vegas) over one sample per completed call (not thread-safe: the
    bulkhead calls it under its lock).

    The queue is estimated as ``limit x (1 - rtt_noload / rtt)`` (``rtt_noload``: the lowest latency seen); with
    ``l = log10(limit)`` (at least 1), no queue (``<= l``) grows the limit by ``6 l``, a queue under ``3 l`` by
    ``l``, a queue over ``6 l`` shrinks it by ``l``; a drop shrinks it by ``l``. Every ``probe_multiplier x limit``
    samples (times a jitter of 0.5..1, from a seeded generator so runs repeat) the next sample becomes the new
    ``rtt_noload``. ``smoothing`` is Netflix's Vegas smoothing (its default there is 1.0: ours, shared with
    Gradient2, is 0.2; set 1.0 for Netflix's behaviour).
    """

    __slots__ = (
        "_max",
        "_min",
        "_probe_at",
        "_probe_count",
        "_probe_jitter",
        "_probe_multiplier",
        "_random",
        "_rtt_noload",
        "_smoothing",
        "cfg",
        "estimated_limit",
        "limit",
    )

    def __init__(self, initial_limit: int, cfg: AdaptiveLimitConfig) -> None:
        self.cfg = cfg
        # The config's numbers copied into slots, as Gradient2Limit and AIMDLimit do: update() runs per call.
        self._probe_multiplier = cfg.probe_multiplier
        self._min = cfg.min_limit
        self._max = cfg.max_limit
        self._smoothing = cfg.smoothing
        self.estimated_limit = float(initial_limit)
        self.limit = initial_limit
        self._rtt_noload = 0
        self._probe_count = 0
        self._random = random.Random(initial_limit)
        self._probe_jitter = self._random.uniform(0.5, 1.0)
        self._set_probe_at()

    def _set_probe_at(self) -> None:
        # The sample count that starts the next probe: it changes only with the jitter or the estimated limit,
        # so it is computed then, not per call.
        self._probe_at = self._probe_jitter * self._probe_multiplier * self.estimated_limit

    def update(self, rtt_ns: int, inflight: int, dropped: bool, end_ns: int = 0) -> int:
        """The new limit after one call that took ``rtt_ns`` with ``inflight`` calls holding permits."""
        if rtt_ns < 1:
            rtt_ns = 1
        self._probe_count += 1
        if self._probe_at <= self._probe_count:
            self._probe_jitter = self._random.uniform(0.5, 1.0)
            self._set_probe_at()
            self._probe_count = 0
            self._rtt_noload = rtt_ns
            return self.limit
        estimated = self.estimated_limit
        noload = self._rtt_noload
        if noload == 0 or rtt_ns < noload:
            self._rtt_noload = rtt_ns
            return self.limit
        if not dropped and inflight * 2 < estimated:  # under half in flight: no drift upwards
            return self.limit
        l10 = _log10_root(int(estimated))
        if dropped:
            new_limit = estimated - l10
        else:
            queue = math.ceil(estimated * (1 - noload / rtt_ns))
            if queue <= l10:
                new_limit = estimated + 6 * l10
            elif queue < 3 * l10:
                new_limit = estimated + l10
            elif queue > 6 * l10:
                new_limit = estimated - l10
            else:
                return self.limit
        new_limit = max(self._min, min(self._max, new_limit))
        smoothing = self._smoothing
        new_limit = (1 - smoothing) * estimated + smoothing * new_limit
        self.estimated_limit = new_limit
        self._set_probe_at()
        self.limit = int(new_limit)
        return self.limit


class LittlesLawLimit:
    """Little's law applied live: ``limit = throughput x no-load latency x (1 + headroom)``, one step per window.

    Calls are gathered in windows as Netflix's ``WindowedLimit`` does (a window closes at the first call ending
    ``clamp(2 x its fastest call, min_window_time, max_window_time)`` after it opened). At each close:

    - **throughput** is the window's successful calls per second; the **no-load latency** is the mean latency
      of calls that met no queue: a window is *queued* when its mean latency (and that of the calls admitted
      under the current limit) exceeds it by more than ``headroom / 2``; an unqueued window updates it;
    - the limit becomes ``ceil(throughput x no-load latency x (1 + headroom))``, or, in an unqueued window whose
      most calls in flight exceeded that product (bursts), that peak x ``(1 + headroom)``; when the calls filled
      the limit without a queue it doubles instead (once a full limit's worth of calls admitted under it has
      ended: a queue shows one latency later): below the partner's capacity the measured throughput is only
      what the limit let through, so Little's law alone would never grow it;
    - it falls by at most half per window (as Envoy's gradient), and a drop caps it at ``limit x backoff_ratio``.

    The no-load latency cannot be seen while calls queue (every latency includes the queue), so it is *probed*,
    as Envoy's gradient controller and BBR's ProbeRTT do: for one window the limit is halved, and the calls that
    started during the probe give the no-load latency. A probe starts when two windows in a row had no call
    within 1.5 x the fastest call seen (the partner slowed, or a queue built up), or when no window confirmed
    that fastest call for ``probe_interval``. Calls faster than 100 µs are ignored, as in Netflix's
    ``WindowedLimit``. Not thread-safe: the bulkhead calls it under its lock.
    """

    __slots__ = (
        "_before_probe",
        "_changed_at",
        "_confirmed_at",
        "_count",
        "_cut",
        "_drops",
        "_floor",
        "_fresh",
        "_fresh_min",
        "_fresh_sum",
        "_limit_f",
        "_max_window",
        "_min_rtt",
        "_min_window",
        "_next_update",
        "_noload",
        "_peak",
        "_probe_interval",
        "_probing",
        "_slow_windows",
        "_sum",
        "_window_start",
        "cfg",
        "limit",
    )

    def __init__(self, initial_limit: int, cfg: AdaptiveLimitConfig) -> None:
        self.cfg = cfg
        self.limit = initial_limit
        self._limit_f = float(initial_limit)
        self._floor = 0  # the fastest call since the no-load latency was last measured (ns)
        self._min_window = int(cfg.min_window_time)
        self._max_window = int(cfg.max_window_time)
        self._probe_interval = int(cfg.probe_interval)
        self._noload = 0.0  # no-load latency: mean latency of calls that met no queue (ns); 0 until a window
        self._confirmed_at = 0
        self._slow_windows = 0
        self._probing = False
        self._cut = False
        self._before_probe = self._limit_f
        self._changed_at = -(1 << 62)  # when the limit last changed: calls started since are "fresh"
        self._next_update = -1
        self._window_start = 0
        self._clear()

    def _clear(self) -> None:
        self._count = 0
        self._sum = 0
        self._min_rtt = 1 << 62
        self._peak = 0
        self._drops = 0
        self._fresh = 0
        self._fresh_sum = 0
        self._fresh_min = 1 << 62

    @property
    def no_load_latency_ns(self) -> int:
        """The no-load latency the limit is computed from: the mean latency of calls that met no queue (0 before
        the first window)."""
        return round(self._noload)

    @property
    def probing(self) -> bool:
        """Whether a probe of the no-load latency is running (the limit is halved for it)."""
        return self._probing

    def update(self, rtt_ns: int, inflight: int, dropped: bool, end_ns: int = 0) -> int:
        """Add one call that took ``rtt_ns`` and ended at ``end_ns``; at a window's close, move the limit."""
        if rtt_ns < 100_000:  # faster than 100 µs: not a call to a partner worth a limit (Netflix's rule)
            return self.limit
        if dropped:
            self._drops += 1
        else:
            self._count += 1
            self._sum += rtt_ns
            if rtt_ns < self._min_rtt:
                self._min_rtt = rtt_ns
            if end_ns - rtt_ns >= self._changed_at:  # admitted under the current limit
                self._fresh += 1
                self._fresh_sum += rtt_ns
                if rtt_ns < self._fresh_min:
                    self._fresh_min = rtt_ns
        if inflight > self._peak:
            self._peak = inflight
        if end_ns < self._next_update:
            return self.limit
        return self._close(end_ns)

    def _close(self, end_ns: int) -> int:
        if self._next_update < 0:  # the first call opens the first window
            self._window_start = end_ns
            self._next_update = end_ns + self._min_window
            self._clear()
            return self.limit
        count, min_rtt, peak, drops, total = self._count, self._min_rtt, self._peak, self._drops, self._sum
        fresh, fresh_sum, fresh_min = self._fresh, self._fresh_sum, self._fresh_min
        elapsed = max(end_ns - self._window_start, 1)
        self._window_start = end_ns
        self._next_update = end_ns + min(max(2 * min_rtt, self._min_window), self._max_window)
        self._clear()
        cfg = self.cfg
        limit = self._limit_f
        if count == 0:
            if drops:
                self._set(limit * cfg.backoff_ratio, end_ns)
            return self.limit
        mean = total / count
        cut = self._cut
        self._cut = False
        if self._probing:
            if fresh == 0:  # no call started during the probe has ended yet
                return self.limit
            self._probing = False
            self._confirmed_at = end_ns
            self._slow_windows = 0
            unchanged = fresh_min <= self._floor * (1 + cfg.headroom)
            self._floor = min(self._floor, fresh_min) if unchanged else fresh_min
            self._noload = fresh_sum / fresh if not unchanged else min(self._noload, fresh_sum / fresh)
            if unchanged:  # the partner did not change: back to the limit before the probe
                self._set(self._before_probe, end_ns)
                return self.limit
        elif self._noload == 0:  # the first window: its calls are all we know
            self._floor, self._noload = min_rtt, mean
        elif min_rtt < self._floor:
            self._floor = min_rtt
        floor, noload = self._floor, self._noload
        # Queued: the window's calls, or those admitted under the current limit (the first of them to end are
        # the fast ones: both must pass), took longer on average than the no-load latency allows.
        bound = noload * (1 + cfg.headroom / 2)
        queued = mean > bound or fresh_sum > fresh * bound
        if not queued:  # the no-load latency is the mean latency of unqueued windows: follow it
            noload = self._noload = mean if mean < noload else noload * 0.8 + mean * 0.2
        if min_rtt <= floor * (1 + cfg.headroom):
            self._confirmed_at = end_ns
        slow = min_rtt > 1.5 * floor
        if not slow:
            self._slow_windows = 0
        elif not cut:  # a window right after a cut still holds the calls queued before it
            self._slow_windows += 1
        # Little's law on the partner's no-load latency; without a queue, the calls in flight the demand needed.
        new = count * noload / elapsed
        if not queued and peak > new:
            new = peak
        new *= 1 + cfg.headroom
        if peak >= self.limit and not queued:
            # The limit held calls back and the calls it let in met no queue (yet): once a full limit's worth
            # of them has ended, double it (the partner has room); until then hold it.
            new = max(new, limit * 2 if fresh >= self.limit else limit)
        if slow:  # not one call near the no-load latency: a queue, or a slower partner; hold until the probe
            new = limit
        new = max(new, limit / 2)
        if drops:
            new = min(new, limit * cfg.backoff_ratio)
        if self._slow_windows >= 2 or end_ns - self._confirmed_at > self._probe_interval:
            self._probing = True
            self._slow_windows = 0
            self._confirmed_at = end_ns
            self._before_probe = limit
            self._set(min(new, limit) / 2, end_ns)
            self._changed_at = end_ns  # even if the limit did not move: the probe's calls start now
            return self.limit
        self._set(new, end_ns)
        self._cut = self._limit_f < limit * 0.8
        return self.limit

    def _set(self, value: float, now_ns: int) -> None:
        cfg = self.cfg
        self._limit_f = max(float(cfg.min_limit), min(float(cfg.max_limit), value))
        limit = math.ceil(self._limit_f - 1e-9)
        if limit != self.limit:
            self.limit = limit
            self._changed_at = now_ns


#: What :func:`make_limit` returns: an object with ``limit`` and ``update(rtt_ns, inflight, dropped, end_ns)``.
AdaptiveLimit = Gradient2Limit | AIMDLimit | VegasLimit | LittlesLawLimit | WindowedLimit


def make_limit(cfg: AdaptiveLimitConfig, initial_limit: int) -> AdaptiveLimit:
    """The algorithm ``cfg`` names, starting at ``initial_limit`` (inside a :class:`WindowedLimit` if asked;
    ``littles_law`` always works on windows)."""
    if cfg.algorithm == LITTLES_LAW:
        return LittlesLawLimit(initial_limit, cfg)
    limit: Gradient2Limit | AIMDLimit | VegasLimit
    if cfg.algorithm == AIMD:
        limit = AIMDLimit(initial_limit, cfg)
    elif cfg.algorithm == VEGAS:
        limit = VegasLimit(initial_limit, cfg)
    else:
        limit = Gradient2Limit(initial_limit, cfg)
    return WindowedLimit(limit, cfg) if cfg.windowed else limit
