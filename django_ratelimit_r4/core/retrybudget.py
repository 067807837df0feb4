"""Retry budgets: retries allowed as a share of recent calls plus a small floor (Finagle's ``RetryBudget``).

A retry multiplies the load on a dependency that is already failing: with ``max_attempts=3`` an outage
triples the traffic it receives. A budget caps that: over a sliding window of ``ttl``, retries may be at
most ``percent_can_retry`` of the calls made plus ``min_retries_per_second`` (so a client that just started,
or sees little traffic, can still retry). During an outage the dependency then sees at most
``1 + percent_can_retry + min_retries_per_second / calls_per_second`` times the calls, instead of
``max_attempts`` times.

The algorithm is Finagle's ``TokenRetryBudget`` over a ``WindowedAdder``: every call deposits 1000 tokens
(none when ``percent_can_retry`` is 0), a retry withdraws ``1000 / percent_can_retry`` (1 when it is 0) if the
balance (tokens of the last ``ttl`` plus a reserve of ``min_retries_per_second * ttl`` withdrawals) covers it.
The window is 10 slices of ``ttl / 10`` on the injected clock; a running total makes each operation O(1).

One budget may be shared by several :class:`~django_ratelimit_r4.core.retry.Retry` instances that call the
same dependency (``Retry(..., budget=budget)``, or ``"budget": "<name>"`` in settings).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from .clock import SYSTEM_CLOCK, Clock
from .config import Validator

__all__ = ["RetryBudget", "RetryBudgetConfig", "RetryBudgetMetrics"]

_NS_PER_S = 1_000_000_000
#: Finagle's ScaleFactor: tokens one call deposits (keeps fractional percentages in integers).
_SCALE = 1000
#: Slices of the sliding window (Finagle's WindowedAdder uses 10).
_SLICES = 10
#: Finagle's bounds on ttl: at least 1 s (shorter is too noisy), at most 60 s.
_MIN_TTL_NS = _NS_PER_S
_MAX_TTL_NS = 60 * _NS_PER_S


@dataclass(frozen=True, slots=True)
class RetryBudgetConfig:
    """Configuration of a :class:`RetryBudget` (Finagle's ``RetryBudget(ttl, minRetriesPerSec, percentCanRetry)``).

    Defaults are Finagle's: a 10 s window, 10 retries per second always allowed, and retries up to 20 % of
    the calls (Envoy's ``retry_budget`` default ``budget_percent`` is 20 % too).
    """

    ttl: Any = "10s"
    min_retries_per_second: int = 10
    percent_can_retry: float = 0.2

    def __post_init__(self) -> None:
        v = Validator(self)
        v.duration("ttl", min_ns=_MIN_TTL_NS, max_ns=_MAX_TTL_NS)
        v.integer("min_retries_per_second", minimum=0)
        v.number("percent_can_retry", ge=0, le=1000)
        v.done()


class RetryBudgetMetrics:
    """Cumulative counters of one :class:`RetryBudget`, read by exporters at scrape time."""

    __slots__ = ("number_of_deposits", "number_of_refused_retries", "number_of_retries")

    def __init__(self) -> None:
        self._clear()

    def _clear(self) -> None:
        #: Calls made through the retries that share this budget (each deposits once).
        self.number_of_deposits = 0
        #: Retries the budget allowed.
        self.number_of_retries = 0
        #: Retries the budget refused: the call failed with its last error instead.
        self.number_of_refused_retries = 0

    def __repr__(self) -> str:
        fields = ", ".join(f"{n}={getattr(self, n)}" for n in self.__slots__)
        return f"RetryBudgetMetrics({fields})"


class RetryBudget:
    """A sliding-window token budget for retries, shareable between retries; thread- and asyncio-safe.

    :meth:`deposit` once per call, :meth:`try_withdraw` before each retry (True: retry; False: give up).
    Both take one short lock and never block on I/O, so async callers use them as they are.
    """

    def __init__(self, name: str, config: RetryBudgetConfig | None = None, *, clock: Clock | None = None) -> None:
        self.name = name
        self.config = config if config is not None else RetryBudgetConfig()
        self.metrics = RetryBudgetMetrics()
        cfg = self.config
        percent = float(cfg.percent_can_retry)
        ttl_ns = int(cfg.ttl)
        self._deposit = 0 if percent == 0 else _SCALE
        self._withdrawal = 1 if percent == 0 else int(_SCALE / percent)
        # The floor: min_retries_per_second * ttl withdrawals always available (Finagle's reserve).
        self._reserve: int = cfg.min_retries_per_second * ttl_ns * self._withdrawal // _NS_PER_S
        self._slice_ns = ttl_ns // _SLICES
        self._empty = percent == 0 and cfg.min_retries_per_second == 0
        self._lock = threading.Lock()
        self.clock: Clock = clock if clock is not None else SYSTEM_CLOCK
        self._clear_window()

    def _clear_window(self) -> None:
        self._slices = [0] * _SLICES
        self._total: int = 0
        self._current = self.clock.now_ns() // self._slice_ns  # index of the newest slice, in slice units

    # -- lifecycle ---------------------------------------------------------------------------------

    def reset(self) -> None:
        """Empty the window and zero the metrics (a fresh budget: only the reserve is available)."""
        with self._lock:
            self._clear_window()
            self.metrics._clear()

    def set_clock(self, clock: Clock) -> None:
        """Use ``clock`` from now on; the window restarts at its current time."""
        with self._lock:
            self.clock = clock
            self._clear_window()

    # -- the window --------------------------------------------------------------------------------

    def _advance(self) -> None:
        """Expire slices older than ``ttl`` (at most all of them: O(1))."""
        now = self.clock.now_ns() // self._slice_ns
        gone = now - self._current
        if gone <= 0:
            return
        slices = self._slices
        if gone >= _SLICES:
            slices[:] = [0] * _SLICES
            self._total = 0
        else:
            for step in range(1, gone + 1):
                i = (self._current + step) % _SLICES
                self._total -= slices[i]
                slices[i] = 0
        self._current = now

    def _add(self, amount: int) -> None:
        self._advance()
        self._slices[self._current % _SLICES] += amount
        self._total += amount

    # -- the budget --------------------------------------------------------------------------------

    def deposit(self) -> None:
        """Record one call (a retry may then spend a share of it)."""
        with self._lock:
            self.metrics.number_of_deposits += 1
            if self._deposit:
                self._add(self._deposit)

    def try_withdraw(self) -> bool:
        """Spend one retry if the budget allows it; False means the caller must not retry."""
        with self._lock:
            if self._empty:
                self.metrics.number_of_refused_retries += 1
                return False
            self._advance()
            if self._total + self._reserve >= self._withdrawal:
                self._add(-self._withdrawal)
                self.metrics.number_of_retries += 1
                return True
            self.metrics.number_of_refused_retries += 1
            return False

    @property
    def balance(self) -> int:
        """Retries the budget would allow right now (Finagle's ``balance``)."""
        with self._lock:
            self._advance()
            return max(0, (self._total + self._reserve) // self._withdrawal)

    def __repr__(self) -> str:
        cfg = self.config
        return (
            f"RetryBudget({self.name!r}, percent_can_retry={cfg.percent_can_retry:g}, "
            f"min_retries_per_second={cfg.min_retries_per_second})"
        )
