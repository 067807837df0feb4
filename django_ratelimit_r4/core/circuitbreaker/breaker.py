"""The circuit breaker state machine: Resilience4j 2.4's ``CircuitBreakerStateMachine``.

State objects (:class:`_StateData`) are replaced on every transition; windows come from
:mod:`.windows`, events from :mod:`.events`, the metrics view from :mod:`.metrics`.
``call`` and ``acall`` inline the hot paths and are twins that differ only in ``await``:
``tests/core/test_circuitbreaker_twins.py`` compares their syntax trees and their behaviour.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..clock import SYSTEM_CLOCK, Clock
from ..coroutines import twin_wrapper
from ..durations import MAX_PERIOD_NS, format_duration, parse_duration
from ..events import Event
from ..exceptions import CallNotPermitted, IllegalStateTransition
from .config import STATE_TRANSITIONS, CircuitBreakerConfig, SlidingWindowType, State
from .events import (
    ALLOW_PUBLISH,
    FORCE_PUBLISH,
    CircuitBreakerEvents,
    CircuitBreakerOnCallNotPermittedEvent,
    CircuitBreakerOnErrorEvent,
    CircuitBreakerOnFailureRateExceededEvent,
    CircuitBreakerOnIgnoredErrorEvent,
    CircuitBreakerOnResetEvent,
    CircuitBreakerOnSlowCallRateExceededEvent,
    CircuitBreakerOnStateTransitionEvent,
    CircuitBreakerOnSuccessEvent,
)
from .metrics import FAILURE_EXCEEDED, SLOW_EXCEEDED, CircuitBreakerMetrics
from .windows import ERROR, SLOW_ERROR, SLOW_SUCCESS, SUCCESS, CountWindow, TimeWindow, Window

__all__ = ["CircuitBreaker", "ResultRecordedAsFailure"]


class ResultRecordedAsFailure(Exception):
    """Stands for a return value that ``record_result`` classified as a failure (in ERROR events).

    Never raised by :meth:`CircuitBreaker.call`: the caller still gets the result, as in Resilience4j.
    """

    def __init__(self, name: str, result: Any) -> None:
        self.name = name
        self.result = result
        super().__init__(f"CircuitBreaker '{name}' has recorded '{result!r}' as a failure")


class _StateData:
    """One state object, as in Resilience4j: every transition installs a new one.

    ``fast`` is True when a call may proceed with no acquire logic at all (CLOSED, METRICS_ONLY,
    DISABLED). ``deadline`` is the OPEN retry deadline, or the HALF_OPEN max-wait deadline (or None);
    ``timed`` says a deadline must be checked lazily on reads (automatic transitions).
    """

    __slots__ = (
        "allow_publish",
        "attempts",
        "deadline",
        "fast",
        "max_permits",
        "permits",
        "rate_flags",
        "ring_fast",
        "state",
        "timed",
        "window",
    )

    def __init__(self, state: State, window: Window, attempts: int) -> None:
        self.state = state
        self.window = window
        self.attempts = attempts
        self.fast = state is State.CLOSED or state is State.METRICS_ONLY or state is State.DISABLED
        self.allow_publish = ALLOW_PUBLISH.get(state, True)
        self.deadline: int | None = None
        self.timed = False
        self.permits = 0
        self.max_permits = 0
        self.rate_flags = 0  # METRICS_ONLY: which *_RATE_EXCEEDED events were already published
        # CLOSED / METRICS_ONLY over a count ring: a plain success replacing a plain success changes
        # no counter and no verdict, so the hot path may skip everything but moving the head.
        self.ring_fast = self.fast and state is not State.DISABLED and type(window) is CountWindow



_OPEN, _HALF_OPEN, _CLOSED = State.OPEN, State.HALF_OPEN, State.CLOSED
_DISABLED, _FORCED_OPEN, _METRICS_ONLY = State.DISABLED, State.FORCED_OPEN, State.METRICS_ONLY
_NS_PER_MS = 1_000_000
_log = logging.getLogger("django_ratelimit_r4.circuitbreaker")
_Pending = list[tuple[Any, ...]]  # events to publish once the lock is released: ("TYPE", *args)
T = TypeVar("T")


def _test(predicate: Callable[[BaseException], bool], exc: BaseException, if_broken: bool, name: str, what: str) -> bool:
    """``predicate(exc)``; a predicate that raises is logged and answers ``if_broken`` (the breaker must go on)."""
    try:
        return bool(predicate(exc))
    except Exception:
        _log.exception("circuit breaker %r: %s raised on %r; treated as %s", name, what, exc, if_broken)
        return if_broken


_MAX_INTERVAL_MS = 2**52  # keeps exponential backoff inside exact float range (~142 000 years)
# Automatic transitions are evaluated lazily; if a clock jump makes more than this many fall due at
# once, the rest are anchored at "now" instead of replaying every cycle one by one.
_MAX_REPLAYED_TRANSITIONS = 64


class CircuitBreaker:
    """Resilience4j 2.4's CircuitBreakerStateMachine, for sync and async callers.

    Calls flow through :meth:`call` / :meth:`acall` / :meth:`decorate`, or through the manual protocol
    (:meth:`acquire_permission`, then :meth:`on_success` / :meth:`on_error` / :meth:`on_result`).
    One ``threading.Lock`` guards the state and the window; it is held for a few integer operations
    only, never while the protected call runs, and never while listeners run.

    Timers are lazy: there is no scheduler thread. With
    ``automatic_transition_from_open_to_half_open_enabled``, OPEN becomes HALF_OPEN on the first read
    of the state (or acquire) at or after the deadline, and the transition is dated at the deadline,
    as if a scheduler had fired on time; ``max_wait_duration_in_half_open_state`` works the same way.
    ``reset()`` therefore never leaves a stale timer behind (Resilience4j's does).

    ``BaseException`` outcomes (``KeyboardInterrupt``, ``SystemExit``, ``asyncio.CancelledError``)
    record nothing and give a half-open permit back: the call said nothing about the remote
    service, and losing the permit would leave the breaker stuck in HALF_OPEN (Resilience4j leaks it
    on ``java.lang.Error``). A permit is only given back to the state object that granted it, so a
    call admitted in CLOSED that ends during HALF_OPEN cannot inflate the number of trial calls.
    """

    __slots__ = (
        "__weakref__",
        "_after_hw",
        "_auto",
        "_count_based",
        "_exp",
        "_fast_ns",
        "_fthr",
        "_hw_ns",
        "_ignore_exc",
        "_ignore_pred",
        "_lock",
        "_max_ms",
        "_min_calls",
        "_mult",
        "_now",
        "_permitted",
        "_rand",
        "_rand_factor",
        "_record_exc",
        "_record_pred",
        "_record_result",
        "_retired_not_permitted",
        "_size",
        "_slow_ns",
        "_st",
        "_sthr",
        "_tot_failed",
        "_tot_failed_ns",
        "_tot_ignored",
        "_tot_ignored_ns",
        "_tot_success",
        "_tot_success_ns",
        "_wait_fn",
        "_wait_ns",
        "clock",
        "config",
        "events",
        "metrics",
        "name",
    )

    def __init__(
        self, name: str, config: CircuitBreakerConfig | None = None, *, clock: Clock | None = None
    ) -> None:
        self.name = name
        self.config = config if config is not None else CircuitBreakerConfig()
        self.clock: Clock = clock if clock is not None else SYSTEM_CLOCK
        self._now = self.clock.now_ns
        self._lock = threading.Lock()
        self.events = CircuitBreakerEvents(self)
        self.metrics = CircuitBreakerMetrics(self)
        self._tot_success = self._tot_success_ns = 0
        self._tot_failed = self._tot_failed_ns = 0
        self._tot_ignored = self._tot_ignored_ns = 0
        # Lifetime rejections = those of retired state objects + the current one's counter (one
        # increment per rejection instead of two).
        self._retired_not_permitted = 0
        self._read_config(self.config)
        self._st = self._initial_state(self._now())

    def _read_config(self, c: CircuitBreakerConfig) -> None:
        # Copied once into slots: the hot path never touches the config object.
        self._slow_ns = int(c.slow_call_duration_threshold)
        self._fthr = float(c.failure_rate_threshold)
        self._sthr = float(c.slow_call_rate_threshold)
        self._count_based = c.sliding_window_type == SlidingWindowType.COUNT_BASED.value
        self._size = c.sliding_window_size
        self._min_calls = c.minimum_number_of_calls
        self._permitted = c.permitted_number_of_calls_in_half_open_state
        # Resilience4j: the half-open timer is on only when the duration is at least 1 ms.
        self._hw_ns = int(c.max_wait_duration_in_half_open_state)
        if self._hw_ns < _NS_PER_MS:
            self._hw_ns = 0
        self._after_hw = State[c.transition_to_state_after_wait_duration]
        self._auto = c.automatic_transition_from_open_to_half_open_enabled
        self._ignore_exc = tuple(c.ignore_exceptions) or None
        self._record_exc = tuple(c.record_exceptions) or None
        # The config stores the predicates already imported when they were given as dotted paths.
        self._ignore_pred: Callable[[BaseException], bool] | None = c.ignore_exception  # type: ignore[assignment]
        self._record_pred: Callable[[BaseException], bool] | None = c.record_exception  # type: ignore[assignment]
        self._record_result = c.record_result
        self._wait_ns = int(c.wait_duration_in_open_state)
        self._wait_fn: Callable[[int], Any] | None = c.wait_interval_function_in_open_state  # type: ignore[assignment]
        self._exp = c.enable_exponential_backoff
        self._mult = float(c.exponential_backoff_multiplier)
        max_wait = c.exponential_max_wait_duration_in_open_state
        # Without a configured cap the open time still stops growing at MAX_PERIOD_NS (366 days), so the
        # 503's Retry-After stays sane (Resilience4j lets it grow to Long.MAX_VALUE ms).
        self._max_ms = (MAX_PERIOD_NS if max_wait is None else int(max_wait)) // _NS_PER_MS
        self._rand = c.enable_randomized_wait
        self._rand_factor = float(c.randomized_wait_factor)
        self._listeners_changed()

    def _listeners_changed(self) -> None:
        # One comparison on the hot path instead of three: a success no longer than _fast_ns may take
        # the inlined path; -1 disables it (listeners to notify, or a record_result predicate to run).
        plain = self._record_result is None and not self.events.wants_calls
        self._fast_ns = self._slow_ns if plain else -1

    # ---------------------------------------------------------------- state objects

    def _closed_window(self, now: int) -> Window:
        if self._count_based:
            return CountWindow(self._size, self._min_calls)
        return TimeWindow(self._size, self._min_calls, now)

    def _open_wait_ns(self, attempts: int) -> int:
        """The OPEN duration for the ``attempts``-th opening (Resilience4j's IntervalFunction, in ms)."""
        if self._wait_fn is not None:
            return self._custom_open_wait_ns(max(attempts, 1))
        if self._exp:
            interval = self._wait_ns // _NS_PER_MS
            mult, cap = self._mult, self._max_ms
            if mult > 1.0:
                for _ in range(max(attempts, 1) - 1):
                    if interval >= _MAX_INTERVAL_MS or (cap is not None and interval >= cap):
                        break
                    interval = int(interval * mult)  # Java's (long) (x * multiplier), step by step
            if cap is not None and interval > cap:
                interval = cap
            return min(interval, _MAX_INTERVAL_MS) * _NS_PER_MS
        if self._rand:
            base = self._wait_ns // _NS_PER_MS
            delta = self._rand_factor * base
            low = base - delta
            # IntervalFunctionCompanion.randomize: at least 1.0 ms (a factor of 1 could otherwise draw 0).
            return int(max(1.0, low + random.random() * (base + delta - low + 1))) * _NS_PER_MS
        return self._wait_ns

    def _custom_open_wait_ns(self, attempts: int) -> int:
        # Runs inside a state transition: a broken function is logged and the configured wait used instead,
        # and the result is kept within [1 ms, 366 days] so the 503's Retry-After stays sane.
        try:
            wait = int(parse_duration(self._wait_fn(attempts)))  # type: ignore[misc]
        except Exception:
            _log.exception(
                "circuit breaker %r: wait_interval_function_in_open_state failed for attempt %d; waiting %s "
                "(wait_duration_in_open_state) instead; return a timedelta or a duration string such as '30s'",
                self.name,
                attempts,
                format_duration(self._wait_ns),
            )
            return self._wait_ns
        return min(max(wait, _NS_PER_MS), MAX_PERIOD_NS)

    def _make_state(
        self, state: State, attempts: int, now: int, window: Window | None = None, wait_ns: int | None = None
    ) -> _StateData:
        if state is _CLOSED or state is _METRICS_ONLY:
            return _StateData(state, self._closed_window(now), 0)
        if state is _OPEN:
            st = _StateData(state, window if window is not None else self._closed_window(now), attempts)
            st.deadline = now + (self._open_wait_ns(attempts) if wait_ns is None else wait_ns)
            st.timed = self._auto
            return st
        if state is _HALF_OPEN:
            # A fresh COUNT_BASED window of `permitted` calls; min calls = min(minimum, permitted).
            st = _StateData(state, CountWindow(self._permitted, self._min_calls), attempts)
            st.permits = st.max_permits = self._permitted
            if self._hw_ns:
                st.deadline = now + self._hw_ns
                st.timed = True
            return st
        # DISABLED and FORCED_OPEN keep an empty window of size 0, as Resilience4j does.
        return _StateData(state, CountWindow(0, 0), attempts if state is _FORCED_OPEN else 0)

    def _initial_state(self, now: int) -> _StateData:
        state = State[self.config.initial_state]
        return self._make_state(state, 0 if state in (_CLOSED, _DISABLED, _METRICS_ONLY) else 1, now)

    # ---------------------------------------------------------------- transitions (lock held)

    def _transition_locked(
        self, to: State, now: int, out: _Pending, *, attempts: int | None = None, wait_ns: int | None = None
    ) -> None:
        cur = self._st
        frm = cur.state
        if (frm, to) not in STATE_TRANSITIONS:
            raise IllegalStateTransition(self.name, frm, to)
        window = None
        if to is _OPEN:
            window = cur.window  # OPEN keeps the previous window and not-permitted counter
            if attempts is None:
                attempts = cur.attempts + 1
        else:
            self._retired_not_permitted += cur.window.not_permitted
        if to is _FORCED_OPEN:
            attempts = cur.attempts + 1
        elif to is _HALF_OPEN:
            attempts = cur.attempts
        self._st = self._make_state(to, attempts or 0, now, window, wait_ns)
        if frm is not to:  # Resilience4j does not publish internal (X -> X) transitions
            out.append(("STATE_TRANSITION", frm, to))

    def _poll_locked(self, now: int, out: _Pending) -> _StateData:
        """Apply the automatic transitions that fell due, each dated at its own deadline."""
        st = self._st
        replayed = 0
        while st.timed and now >= st.deadline:  # type: ignore[operator]
            at = st.deadline if replayed < _MAX_REPLAYED_TRANSITIONS else now
            replayed += 1
            self._transition_locked(_HALF_OPEN if st.state is _OPEN else self._after_hw, at, out)  # type: ignore[arg-type]
            st = self._st
        return st

    def _flush(self, out: _Pending) -> None:
        """Publish events queued under the lock, in order (listeners never run under the lock)."""
        events = self.events
        if not events.has_listeners:
            return
        name = self.name
        for item in out:
            event_type = item[0]
            if event_type == "STATE_TRANSITION":
                events.publish(
                    CircuitBreakerOnStateTransitionEvent(event_type, name, from_state=item[1], to_state=item[2])
                )
            elif event_type == "FAILURE_RATE_EXCEEDED":
                events.publish(CircuitBreakerOnFailureRateExceededEvent(event_type, name, failure_rate=item[1]))
            elif event_type == "SLOW_CALL_RATE_EXCEEDED":
                events.publish(CircuitBreakerOnSlowCallRateExceededEvent(event_type, name, slow_call_rate=item[1]))

    def _publish(self, event: Event) -> None:
        # Resilience4j's shouldPublishEvents: DISABLED and FORCED_OPEN only let forced types through.
        if self._st.allow_publish or event.event_type in FORCE_PUBLISH:
            self.events.publish(event)

    # ---------------------------------------------------------------- permission

    def _acquire_slow(self) -> _StateData | CallNotPermitted:
        """Acquire in a state that may reject: the granting state object, or the exception to raise."""
        lock = self._lock
        lock.acquire()
        try:
            now = self._now()
            st = self._st
            if st.state is _OPEN and not st.timed and now <= st.deadline:  # type: ignore[operator]
                # The common rejection; the first call strictly after the deadline goes HALF_OPEN.
                st.window.not_permitted += 1
                wait = st.deadline - now  # type: ignore[operator]
            else:
                wait = -1
        finally:
            lock.release()
        if wait < 0:
            return self._acquire_general()
        return self._rejection(_OPEN, wait)

    def _acquire_general(self) -> _StateData | CallNotPermitted:
        out: _Pending = []
        rejected: State | None = None
        wait = 0
        lock = self._lock
        lock.acquire()
        try:
            now = self._now()
            st = self._poll_locked(now, out) if self._st.timed else self._st
            state = st.state
            if state is _OPEN:
                if now > st.deadline:  # type: ignore[operator]  # strictly after, like Instant.isAfter
                    self._transition_locked(_HALF_OPEN, now, out)
                    st = self._st
                    state = _HALF_OPEN
                else:
                    rejected, wait = _OPEN, st.deadline - now  # type: ignore[operator]
            if state is _HALF_OPEN:
                if st.permits > 0:
                    st.permits -= 1
                else:
                    rejected = _HALF_OPEN
            elif state is _FORCED_OPEN:
                rejected, wait = _FORCED_OPEN, self._wait_ns
            if rejected is not None:
                st.window.not_permitted += 1
        finally:
            lock.release()
            if out:
                self._flush(out)
        return st if rejected is None else self._rejection(rejected, wait)

    def _rejection(self, state: State, wait_ns: int) -> CallNotPermitted:
        """Publish NOT_PERMITTED and build the exception to raise (outside the lock).

        A new instance per rejection, never a shared one whose traceback would grow; its message is
        built lazily, so construction is a few attribute stores.
        """
        if self.events.wants_calls and state is not _FORCED_OPEN:
            self.events.publish(CircuitBreakerOnCallNotPermittedEvent("NOT_PERMITTED", self.name))
        return CallNotPermitted(self, state, wait_ns)

    def try_acquire_permission(self) -> bool:
        """Take a permission without raising: False when OPEN, FORCED_OPEN or out of half-open trials.

        In HALF_OPEN a permission is one of the N trial calls: report its outcome with
        :meth:`on_success` / :meth:`on_error` / :meth:`on_result`, or give it back with
        :meth:`release_permission`.
        """
        if self._st.fast:
            return True
        return self._acquire_slow().__class__ is _StateData

    def acquire_permission(self) -> None:
        """Like :meth:`try_acquire_permission` but raises :class:`CallNotPermitted` (with ``wait_ns``).

        Resilience4j's naming, kept: on a circuit breaker and a bulkhead ``acquire_permission`` raises and
        ``try_acquire_permission`` answers a bool, while ``RateLimiter.acquire_permission`` answers a bool
        (its raising form is ``acquire_or_raise``).
        """
        if self._st.fast:
            return
        granted: Any = self._acquire_slow()
        if granted.__class__ is not _StateData:
            try:
                raise granted
            finally:
                granted = None  # no exc -> traceback -> frame -> exc cycle

    def release_permission(self) -> None:
        """Give back a half-open trial permission taken but not used (never above the configured N)."""
        with self._lock:
            st = self._st
            if st.state is _HALF_OPEN and st.permits < st.max_permits:
                st.permits += 1

    def _release_granted(self, granted: _StateData | None) -> None:
        # Only the state object that granted the permit gets it back (see the class docstring).
        with self._lock:
            st = self._st
            if (granted is None or st is granted) and st.state is _HALF_OPEN and st.permits < st.max_permits:
                st.permits += 1

    # ---------------------------------------------------------------- outcomes

    def _record(self, code: int, end: int, out: _Pending) -> None:
        """Record an outcome into the current state and apply its consequences. Lock held."""
        st = self._st
        if st.timed:
            st = self._poll_locked(end, out)
        state = st.state
        if state is _DISABLED or state is _FORCED_OPEN:
            return
        w = st.window
        w.record(code, end)
        if state is _OPEN:
            return  # late results land in the carried-over window but never change state
        n = w.calls
        if n == 0 or n < w.min_calls:
            return  # BELOW_MINIMUM_CALLS_THRESHOLD
        failure_rate = w.failed * 100.0 / n
        slow_rate = w.slow * 100.0 / n
        verdict = (failure_rate >= self._fthr) | ((slow_rate >= self._sthr) << 1)
        if state is _CLOSED:
            if verdict:
                if verdict & FAILURE_EXCEEDED:
                    out.append(("FAILURE_RATE_EXCEEDED", failure_rate))
                if verdict & SLOW_EXCEEDED:
                    out.append(("SLOW_CALL_RATE_EXCEEDED", slow_rate))
                self._transition_locked(_OPEN, end, out)
        elif state is _HALF_OPEN:
            self._transition_locked(_OPEN if verdict else _CLOSED, end, out)
        elif verdict:  # METRICS_ONLY: report each kind of excess once, never transition
            if verdict & FAILURE_EXCEEDED and not st.rate_flags & FAILURE_EXCEEDED:
                st.rate_flags |= FAILURE_EXCEEDED
                out.append(("FAILURE_RATE_EXCEEDED", failure_rate))
            if verdict & SLOW_EXCEEDED and not st.rate_flags & SLOW_EXCEEDED:
                st.rate_flags |= SLOW_EXCEEDED
                out.append(("SLOW_CALL_RATE_EXCEEDED", slow_rate))

    def _success(self, duration_ns: int, end: int) -> None:
        if self.events.wants_calls:
            self._publish(CircuitBreakerOnSuccessEvent("SUCCESS", self.name, elapsed_ns=duration_ns))
        lock = self._lock
        lock.acquire()
        try:
            self._tot_success += 1
            self._tot_success_ns += duration_ns
            st = self._st
            if st.ring_fast and duration_ns <= self._slow_ns:
                w: Any = st.window
                head = w.head + 1
                if head == w.size:
                    head = 0
                # An occupied next slot means the ring is full (so >= minimum calls); a plain
                # success replacing a plain success cannot change any rate. (Same in call/acall.)
                if w.ring[head] == SUCCESS:
                    w.head = head
                    return
            out: _Pending = []
            self._record(SLOW_SUCCESS if duration_ns > self._slow_ns else SUCCESS, end, out)
        finally:
            lock.release()
        if out:
            self._flush(out)

    def _failure(self, duration_ns: int, exc: BaseException, end: int) -> None:
        if self.events.wants_calls:
            self._publish(
                CircuitBreakerOnErrorEvent("ERROR", self.name, elapsed_ns=duration_ns, exception=exc)
            )
        out: _Pending = []
        lock = self._lock
        lock.acquire()
        try:
            self._tot_failed += 1
            self._tot_failed_ns += duration_ns
            self._record(SLOW_ERROR if duration_ns > self._slow_ns else ERROR, end, out)
        finally:
            lock.release()
        if out:
            self._flush(out)

    def _error(self, duration_ns: int, exc: BaseException, end: int, granted: _StateData | None) -> None:
        ignore = self._ignore_exc
        ignore_pred = self._ignore_pred
        if (ignore is not None and isinstance(exc, ignore)) or (
            ignore_pred is not None and _test(ignore_pred, exc, False, self.name, "ignore_exception")
        ):
            self._release_granted(granted)
            with self._lock:
                self._tot_ignored += 1
                self._tot_ignored_ns += duration_ns
            if self.events.wants_calls:
                self._publish(
                    CircuitBreakerOnIgnoredErrorEvent(
                        "IGNORED_ERROR", self.name, elapsed_ns=duration_ns, exception=exc
                    )
                )
            return
        record = self._record_exc
        record_pred = self._record_pred
        if (
            (record is None and record_pred is None)
            or (record is not None and isinstance(exc, record))
            or (record_pred is not None and _test(record_pred, exc, True, self.name, "record_exception"))
        ):
            self._failure(duration_ns, exc, end)
        else:
            self._success(duration_ns, end)  # matched neither the record list nor the predicate: a success

    def _result(self, duration_ns: int, result: Any, end: int) -> None:
        predicate: Any = self._record_result
        if predicate is not None and predicate(result):
            self._failure(duration_ns, ResultRecordedAsFailure(self.name, result), end)
        else:
            self._success(duration_ns, end)

    def on_success(self, duration_ns: int) -> None:
        """Record a successful call that took ``duration_ns`` (manual protocol)."""
        self._success(duration_ns, self._now())

    def on_error(self, duration_ns: int, exc: BaseException) -> None:
        """Classify and record a call that raised ``exc``: ignored, failure, or success."""
        self._error(duration_ns, exc, self._now(), None)

    def on_result(self, duration_ns: int, result: Any) -> None:
        """Record a returned value: a failure if ``record_result(result)`` is true, else a success.

        Unlike Resilience4j (which skips ``null``), the predicate also sees ``None``.
        """
        self._result(duration_ns, result, self._now())

    # ---------------------------------------------------------------- protected calls

    def call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` under the breaker; raises :class:`CallNotPermitted` if refused."""
        st: Any = self._st
        if not st.fast:
            # Inlined common case of _acquire_slow: OPEN before its deadline rejects.
            lock = self._lock
            lock.acquire()
            try:
                now_ns = self._now()
                st = self._st
                if st.state is _OPEN and not st.timed and now_ns <= st.deadline:
                    st.window.not_permitted += 1
                    wait = st.deadline - now_ns
                else:
                    wait = -1
            finally:
                lock.release()
            if wait >= 0 and not self.events.wants_calls:
                # The common rejection, inlined (no _rejection call): a fresh exception every time.
                raise CallNotPermitted(self, _OPEN, wait)
            st = self._rejection(_OPEN, wait) if wait >= 0 else self._acquire_general()
            if st.__class__ is not _StateData:
                try:
                    raise st
                finally:
                    st = None  # the traceback holds this frame: break the exc -> frame -> exc cycle
        now = self._now
        start = now()
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:
            end = now()
            self._error(end - start, exc, end, st)
            raise
        except BaseException:
            self._release_granted(st)
            raise
        end = now()
        duration = end - start
        if duration <= self._fast_ns:
            # Inlined fast path of _success: plain (not slow) success, no listeners, no record_result,
            # CLOSED or METRICS_ONLY over a full count ring.
            lock = self._lock
            lock.acquire()
            try:
                st = self._st
                if st.ring_fast:
                    w = st.window
                    head = w.head + 1
                    if head == w.size:
                        head = 0
                    if w.ring[head] == SUCCESS:
                        w.head = head
                        self._tot_success += 1
                        self._tot_success_ns += duration
                        return result
            finally:
                lock.release()
        if self._record_result is None:
            self._success(duration, end)
        else:
            self._result(duration, result, end)
        return result

    async def acall(self, fn: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any) -> T:
        """Await ``fn(*args, **kwargs)`` under the breaker (same rules as :meth:`call`)."""
        st: Any = self._st
        if not st.fast:
            # Inlined common case of _acquire_slow: OPEN before its deadline rejects.
            lock = self._lock
            lock.acquire()
            try:
                now_ns = self._now()
                st = self._st
                if st.state is _OPEN and not st.timed and now_ns <= st.deadline:
                    st.window.not_permitted += 1
                    wait = st.deadline - now_ns
                else:
                    wait = -1
            finally:
                lock.release()
            if wait >= 0 and not self.events.wants_calls:
                raise CallNotPermitted(self, _OPEN, wait)
            st = self._rejection(_OPEN, wait) if wait >= 0 else self._acquire_general()
            if st.__class__ is not _StateData:
                try:
                    raise st
                finally:
                    st = None  # the traceback holds this frame: break the exc -> frame -> exc cycle
        now = self._now
        start = now()
        try:
            result = await fn(*args, **kwargs)
        except Exception as exc:
            end = now()
            self._error(end - start, exc, end, st)
            raise
        except BaseException:  # asyncio.CancelledError among others
            self._release_granted(st)
            raise
        end = now()
        duration = end - start
        if duration <= self._fast_ns:
            # Inlined fast path of _success: plain (not slow) success, no listeners, no record_result,
            # CLOSED or METRICS_ONLY over a full count ring.
            lock = self._lock
            lock.acquire()
            try:
                st = self._st
                if st.ring_fast:
                    w = st.window
                    head = w.head + 1
                    if head == w.size:
                        head = 0
                    if w.ring[head] == SUCCESS:
                        w.head = head
                        self._tot_success += 1
                        self._tot_success_ns += duration
                        return result
            finally:
                lock.release()
        if self._record_result is None:
            self._success(duration, end)
        else:
            self._result(duration, result, end)
        return result

    def decorate(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Wrap a function or a coroutine function so that every call goes through the breaker."""
        return twin_wrapper(fn, self.call, self.acall)

    # ---------------------------------------------------------------- state

    @property
    def state(self) -> State:
        """The current :class:`State` (applies automatic transitions that fell due)."""
        st = self._st
        if st.timed:
            st = self._polled()
        return st.state

    def _polled(self) -> _StateData:
        out: _Pending = []
        with self._lock:
            st = self._poll_locked(self._now(), out)
        if out:
            self._flush(out)
        return st

    def remaining_open_ns(self) -> int:
        """Nanoseconds left in OPEN (0 otherwise); FORCED_OPEN answers ``wait_duration_in_open_state``.

        This is the Retry-After source for a 503 when the breaker rejects.
        """
        st = self._st
        if st.timed:
            st = self._polled()
        if st.state is _OPEN:
            return max(0, st.deadline - self._now())  # type: ignore[operator]
        if st.state is _FORCED_OPEN:
            return self._wait_ns
        return 0

    def _manual(self, to: State, **kwargs: Any) -> None:
        out: _Pending = []
        lock = self._lock
        lock.acquire()
        try:
            now = self._now()
            if self._st.timed:
                self._poll_locked(now, out)
            self._transition_locked(to, now, out, **kwargs)
        finally:
            lock.release()
            if out:
                self._flush(out)

    def transition_to_closed_state(self) -> None:
        """Force CLOSED with a fresh window."""
        self._manual(_CLOSED)

    def transition_to_open_state(self) -> None:
        """Force OPEN for the configured wait (attempts + 1, so exponential backoff grows)."""
        self._manual(_OPEN)

    def transition_to_open_state_for(self, duration: Any) -> None:
        """Force OPEN for ``duration`` (timedelta, ``"30s"`` or :class:`Nanos`); attempts unchanged."""
        wait_ns = parse_duration(duration)
        self._manual(_OPEN, attempts=self._st.attempts, wait_ns=int(wait_ns))

    def transition_to_half_open_state(self) -> None:
        """Force HALF_OPEN with a fresh set of trial permits."""
        self._manual(_HALF_OPEN)

    def transition_to_disabled_state(self) -> None:
        """Always permit and record nothing, until another transition."""
        self._manual(_DISABLED)

    def transition_to_metrics_only_state(self) -> None:
        """Always permit, record, publish rate-exceeded events once, never transition by itself."""
        self._manual(_METRICS_ONLY)

    def transition_to_forced_open_state(self) -> None:
        """Always reject, until another transition."""
        self._manual(_FORCED_OPEN)

    def reset(self) -> None:
        """Return to the freshly-built state (``initial_state``, fresh window); lifetime totals stay.

        Publishes STATE_TRANSITION (if the state changes) and then RESET, like Resilience4j.
        """
        with self._lock:
            previous = self._st.state
            self._retired_not_permitted += self._st.window.not_permitted
            self._st = self._initial_state(self._now())
            current = self._st.state
        if self.events.has_listeners:
            if previous is not current:
                self.events.publish(
                    CircuitBreakerOnStateTransitionEvent(
                        "STATE_TRANSITION", self.name, from_state=previous, to_state=current
                    )
                )
            self.events.publish(CircuitBreakerOnResetEvent("RESET", self.name))

    def set_clock(self, clock: Clock) -> None:
        """Use ``clock`` from now on and rebuild the state silently, anchored at its current time."""
        with self._lock:
            self.clock = clock
            self._now = clock.now_ns
            self._retired_not_permitted += self._st.window.not_permitted
            self._st = self._initial_state(clock.now_ns())

    def __repr__(self) -> str:
        return f"CircuitBreaker(name={self.name!r}, state={self._st.state.name})"
