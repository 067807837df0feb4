"""Event-loop stall detector: Python's counterpart of JFR's ``jdk.VirtualThreadPinned``.

A blocking call inside a coroutine (``time.sleep``, a sync Redis or ORM call, a contended
``threading.Lock``) freezes the event loop, and with it every request of that worker. It is the
asyncio form of a Java virtual thread pinned to its carrier: the loop thread is the only carrier,
and no runtime fix unpins it. This module finds such calls in production.

How it works: a daemon *watchdog* thread posts a heartbeat onto the loop with
``loop.call_soon_threadsafe`` and waits ``threshold`` for it to be serviced. If it is not, the loop
is stalled: the watchdog captures the **loop thread's** stack right then, while it is still blocked
(that stack is the code that blocked the loop), waits for the heartbeat to run, and records the
stall's duration. The cost is one tiny callback per ``interval`` on the loop and one mostly-asleep
thread; nothing is added to any request.

Enable it with ``RATELIMIT_R4["stall_detector"] = {"enabled": True}`` when
:class:`~django_ratelimit_r4.middleware.ResilienceMiddleware` runs in async mode (it starts one
detector per event loop at its first request), or in ``asgi.py`` with one line::

    application = monitor_asgi(get_asgi_application())  # threshold from the setting (default 20 ms)

The recorded duration is the heartbeat's lag: the time a request arriving during the stall would
have waited. It undercounts the real block by at most ``interval`` (the block may have begun just
before the heartbeat was posted), so blocks shorter than ``threshold + interval`` may be missed.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from datetime import timedelta
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple

from .core.durations import parse_duration

if TYPE_CHECKING:
    from .conf import StallDetectorOptions

__all__ = [
    "DEFAULT_THRESHOLD_S",
    "STALL_BUCKETS",
    "StallDetector",
    "StallEvent",
    "StallMonitor",
    "StallStats",
    "add_stall_listener",
    "configured_options",
    "ensure_detector",
    "get_detectors",
    "monitor_asgi",
    "remove_stall_listener",
]

#: JFR records ``jdk.VirtualThreadPinned`` above 20 ms; a loop blocked that long already adds a
#: visible 20 ms to every request in flight on the worker.
DEFAULT_THRESHOLD_S = 0.020

#: Upper bounds (seconds) of the stall-duration histogram buckets; an implicit +Inf bucket follows.
STALL_BUCKETS: tuple[float, ...] = (0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

logger = logging.getLogger("django_ratelimit_r4.stall")

# While waiting for a late heartbeat, wake this often to notice a closed loop.
_POLL_S = 0.25

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
StallListener = Callable[["StallEvent"], object]


@dataclass(frozen=True, slots=True)
class StallEvent:
    """One stall: how long the loop did not answer and where its thread was while it was blocked.

    ``stack`` is the loop thread's stack captured when the stall crossed the threshold, outermost
    frame first (like :func:`traceback.extract_stack`); its source lines are read lazily.
    It is empty if the loop thread could not be identified.
    """

    duration_s: float
    stack: traceback.StackSummary
    name: str = "default"

    def format_stack(self) -> str:
        """Return the stack rendered as a traceback would show it."""
        return _format_stack(self.stack)


class StallStats(NamedTuple):
    """A consistent copy of a detector's cumulative counters (see :meth:`StallDetector.snapshot`)."""

    stalls_total: int
    stall_seconds_total: float
    max_stall_seconds: float
    bucket_counts: tuple[int, ...]


def _format_stack(stack: traceback.StackSummary) -> str:
    # A module function so tests can prove it is not called when WARNING is disabled.
    return "".join(stack.format())


def _capture_stack(thread_id: int | None) -> traceback.StackSummary:
    """Extract ``thread_id``'s current stack without reading source files (done lazily on format)."""
    if thread_id is None:
        return traceback.StackSummary()
    frame: FrameType | None = sys._current_frames().get(thread_id)
    if frame is None:
        return traceback.StackSummary()
    try:
        stack = traceback.StackSummary.extract(traceback.walk_stack(frame), lookup_lines=False)
    finally:
        del frame  # do not keep the blocked thread's frames (and their locals) alive
    stack.reverse()
    return stack


def _to_seconds(value: float | str | timedelta, what: str) -> float:
    """Numbers are seconds (like asyncio's own timeouts); strings and timedeltas go through parse_duration."""
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a duration, got {value!r}")
    seconds = float(value) if isinstance(value, (int, float)) else parse_duration(value) / 1e9
    if not seconds > 0:
        raise ValueError(f"{what} must be positive, got {value!r}")
    return seconds


_live: list[StallDetector] = []
_live_lock = threading.Lock()
_listeners: list[StallListener] = []


def get_detectors() -> list[StallDetector]:
    """Return the detectors currently watching a loop in this process (a copy; safe to iterate).

    Exporters read each detector's counters (``stalls_total``, ``stall_seconds_total``,
    ``max_stall_seconds``, ``bucket_counts``) at scrape time.
    """
    with _live_lock:
        return list(_live)


def add_stall_listener(listener: StallListener) -> StallListener:
    """Call ``listener(event)`` for every stall recorded by any detector in this process.

    For exporters that cannot read counters at scrape time (prometheus_client's multiprocess
    mode has no custom collectors) and observe a histogram instead. Runs on the watchdog thread;
    exceptions are logged and ignored. Returns ``listener`` so it works as a decorator.
    """
    with _live_lock:
        _listeners.append(listener)
    return listener


def remove_stall_listener(listener: StallListener) -> None:
    """Undo :func:`add_stall_listener`; unknown listeners are ignored."""
    with _live_lock:
        if listener in _listeners:
            _listeners.remove(listener)


def _running_loop_thread_id(loop: asyncio.AbstractEventLoop) -> int | None:
    """The id of the thread running ``loop``, read from another thread; None if unknown.

    asyncio has no public way to ask a loop for its thread, so this is the one place that reads
    CPython's private ``BaseEventLoop._thread_id`` (set while ``run_forever`` runs). It is only a head
    start: the first heartbeat records the thread with ``threading.get_ident()`` on the loop itself.
    ``tests/test_stall.py::test_running_loop_thread_id_reads_cpython_loop`` fails if CPython changes it.
    """
    thread_id = getattr(loop, "_thread_id", None)
    return thread_id if isinstance(thread_id, int) else None


class _Watch:
    """State of one start()..stop() run, so a restarted detector never shares events with an old thread."""

    __slots__ = ("loop", "loop_thread_id", "pong", "pong_at", "stop", "thread")

    def __init__(self, loop: asyncio.AbstractEventLoop, loop_thread_id: int | None) -> None:
        self.loop = loop
        self.loop_thread_id = loop_thread_id
        self.pong = threading.Event()
        self.stop = threading.Event()
        self.pong_at = 0.0
        self.thread: threading.Thread | None = None

    def on_pong(self) -> None:
        # Runs on the loop: a few attribute writes, then wake the watchdog.
        self.pong_at = time.monotonic()
        self.loop_thread_id = threading.get_ident()
        self.pong.set()


class StallDetector:
    """Watches one asyncio event loop and records every stall longer than ``threshold``.

    Args:
        threshold: seconds (float) or a duration string such as ``"20ms"``; default 20 ms.
        interval: seconds between heartbeats while the loop is healthy; default ``threshold / 2``.
        logger: where stalls are logged (one WARNING with the stack per stall).
        on_stall: called with a :class:`StallEvent` on the watchdog thread after each stall.
        hang_report_after: if a stall is still going on after this many seconds, log it once more
            right away with the stack, so a loop that never recovers is reported too (at least
            ``2 * threshold``); ``None`` turns that off.
        name: a label for logs and exporters.

    Cumulative counters, plain attributes written only by the watchdog thread: ``stalls_total``,
    ``stall_seconds_total``, ``max_stall_seconds``, ``bucket_counts`` (one count per
    :data:`STALL_BUCKETS` bound plus +Inf, not cumulative) and ``last_stall``.
    """

    def __init__(
        self,
        threshold: float | str | timedelta = DEFAULT_THRESHOLD_S,
        *,
        interval: float | str | timedelta | None = None,
        logger: logging.Logger = logger,
        on_stall: StallListener | None = None,
        hang_report_after: float | None = 1.0,
        name: str = "default",
    ) -> None:
        self.threshold: float = _to_seconds(threshold, "threshold")
        self.interval: float = self.threshold / 2 if interval is None else _to_seconds(interval, "interval")
        self.logger = logger
        self.on_stall = on_stall
        self.hang_report_after = hang_report_after
        self.name = name
        self.buckets: tuple[float, ...] = STALL_BUCKETS
        self.stalls_total = 0
        self.stall_seconds_total = 0.0
        self.max_stall_seconds = 0.0
        self.bucket_counts: list[int] = [0] * (len(STALL_BUCKETS) + 1)
        self.last_stall: StallEvent | None = None
        self._counters_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._watch: _Watch | None = None

    def __repr__(self) -> str:
        return (
            f"StallDetector(name={self.name!r}, threshold={self.threshold}, running={self.running}, "
            f"stalls_total={self.stalls_total})"
        )

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """True while the watchdog thread is watching a loop."""
        watch = self._watch
        return watch is not None and watch.thread is not None and watch.thread.is_alive()

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop being watched, or ``None`` when stopped."""
        watch = self._watch
        return watch.loop if watch is not None else None

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> StallDetector:
        """Start watching ``loop`` (default: the running loop). Idempotent for the same loop.

        Raises RuntimeError without a running loop when ``loop`` is omitted, or when the detector
        already watches a different loop.
        """
        if loop is None:
            loop = asyncio.get_running_loop()
        with self._state_lock:
            if self.running:
                assert self._watch is not None
                if self._watch.loop is loop:
                    return self
                raise RuntimeError(f"{self!r} already watches another event loop; stop() it first")
            thread_id = self._loop_thread_id(loop)
            watch = _Watch(loop, thread_id)
            watch.thread = threading.Thread(
                target=self._run, args=(watch,), name=f"r4-stall-detector[{self.name}]", daemon=True
            )
            self._watch = watch
            with _live_lock:
                _live.append(self)
            watch.thread.start()
        return self

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stop watching and join the watchdog thread. Idempotent; counters are kept."""
        with self._state_lock:
            watch = self._watch
            self._watch = None
        if watch is None:
            return
        watch.stop.set()
        watch.pong.set()  # wakes a watchdog waiting on a heartbeat
        self._unregister()
        if watch.thread is not None and watch.thread is not threading.current_thread():
            watch.thread.join(timeout)

    async def __aenter__(self) -> StallDetector:
        return self.start(asyncio.get_running_loop())

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- counters ------------------------------------------------------------------------------

    def snapshot(self) -> StallStats:
        """Return all counters read together (the plain attributes may be mid-update)."""
        with self._counters_lock:
            return StallStats(
                self.stalls_total,
                self.stall_seconds_total,
                self.max_stall_seconds,
                tuple(self.bucket_counts),
            )

    def cumulative_buckets(self) -> list[tuple[float, int]]:
        """Prometheus-style ``(le, count)`` pairs, cumulative, ending with ``(inf, stalls_total)``."""
        counts = self.snapshot().bucket_counts
        out: list[tuple[float, int]] = []
        running = 0
        for bound, count in zip((*self.buckets, float("inf")), counts, strict=True):
            running += count
            out.append((bound, running))
        return out

    def reset(self) -> None:
        """Zero every counter (for tests; exporters expect counters to only grow)."""
        with self._counters_lock:
            self.stalls_total = 0
            self.stall_seconds_total = 0.0
            self.max_stall_seconds = 0.0
            self.bucket_counts = [0] * (len(self.buckets) + 1)
            self.last_stall = None

    # -- watchdog thread -----------------------------------------------------------------------

    @staticmethod
    def _loop_thread_id(loop: asyncio.AbstractEventLoop) -> int | None:
        try:
            if asyncio.get_running_loop() is loop:
                return threading.get_ident()
        except RuntimeError:
            pass
        return _running_loop_thread_id(loop)

    def _unregister(self) -> None:
        with _live_lock:
            if self in _live:
                _live.remove(self)

    def _run(self, watch: _Watch) -> None:
        loop, pong, stop = watch.loop, watch.pong, watch.stop
        threshold, interval = self.threshold, self.interval
        try:
            while not stop.is_set():
                pong.clear()
                sent = time.monotonic()
                try:
                    loop.call_soon_threadsafe(watch.on_pong)
                except RuntimeError:  # the loop was closed: nothing left to watch
                    return
                if not pong.wait(threshold) and not self._follow_stall(watch, sent):
                    return
                if stop.wait(interval):
                    return
        except Exception:  # never let the watchdog die silently
            self.logger.exception("stall detector %r crashed", self.name)
        finally:
            if self._watch is watch:
                with self._state_lock:
                    if self._watch is watch:
                        self._watch = None
                self._unregister()

    def _follow_stall(self, watch: _Watch, sent: float) -> bool:
        """The heartbeat is late: capture the blocked stack, wait it out, record. False means exit."""
        loop, pong, stop = watch.loop, watch.pong, watch.stop
        if stop.is_set():
            return False
        # A loop that is merely not running (between run_until_complete calls) is not stalled.
        stalled = loop.is_running()
        stack = _capture_stack(watch.loop_thread_id) if stalled else traceback.StackSummary()
        hang_at = None
        if stalled and self.hang_report_after is not None:
            # Never report a "hang" in the same breath as detecting the stall.
            hang_at = sent + max(self.hang_report_after, 2 * self.threshold)
        while not pong.wait(
            _POLL_S if hang_at is None else max(0.0, min(_POLL_S, hang_at - time.monotonic()))
        ):
            if stop.is_set() or loop.is_closed():
                return False
            if hang_at is not None and time.monotonic() >= hang_at:
                hang_at = None
                self._log_hang(time.monotonic() - sent, _capture_stack(watch.loop_thread_id))
        if stop.is_set():
            return False
        duration = watch.pong_at - sent
        # Re-check against the loop-side timestamp: a watchdog descheduled past its timeout is not a stall.
        if stalled and duration >= self.threshold:
            self._record(duration, stack)
        return True

    def _record(self, duration: float, stack: traceback.StackSummary) -> None:
        event = StallEvent(duration, stack, self.name)
        with self._counters_lock:
            self.stalls_total += 1
            self.stall_seconds_total += duration
            if duration > self.max_stall_seconds:
                self.max_stall_seconds = duration
            # Prometheus buckets are "le": the first bound >= duration.
            self.bucket_counts[bisect.bisect_left(self.buckets, duration)] += 1
            self.last_stall = event
        log = self.logger
        if log.isEnabledFor(logging.WARNING):
            log.warning(
                "event loop %r blocked for %.3f s (threshold %.3f s); the loop thread was running:\n%s",
                self.name,
                duration,
                self.threshold,
                _format_stack(stack),
            )
        with _live_lock:
            listeners = [self.on_stall, *_listeners] if self.on_stall is not None else list(_listeners)
        for listener in listeners:
            try:
                listener(event)
            except Exception:
                log.exception("stall listener %r failed", listener)

    def _log_hang(self, so_far: float, stack: traceback.StackSummary) -> None:
        if self.logger.isEnabledFor(logging.WARNING):
            self.logger.warning(
                "event loop %r has been blocked for %.3f s and still is; the loop thread is running:\n%s",
                self.name,
                so_far,
                _format_stack(stack),
            )


def configured_options() -> StallDetectorOptions:
    """``RATELIMIT_R4["stall_detector"]`` as ``StallDetectorOptions(enabled, threshold_ns)``.

    Read when called (never at import); callers cache it. Outside a configured Django project, or when
    ``RATELIMIT_R4``'s options are invalid (logged as an error; ``manage.py check`` lists them), the
    defaults: disabled, 20 ms.
    """
    # Imported here: the detector itself works without a Django project (worker scripts).
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    from . import conf

    if not settings.configured:
        return conf.StallDetectorOptions()
    try:
        return conf.get_options().stall_detector
    except ImproperlyConfigured:
        logger.exception("stall detector: invalid RATELIMIT_R4 options, using the defaults (disabled, 20 ms)")
        return conf.StallDetectorOptions()


_ensure_lock = threading.Lock()


def ensure_detector(
    loop: asyncio.AbstractEventLoop | None = None,
    *,
    threshold: float | str | timedelta | None = None,
    name: str = "asgi",
    **detector_kwargs: Any,
) -> StallDetector:
    """Return the running detector that watches ``loop`` (default: the running loop), starting one if none does.

    Used by :class:`~django_ratelimit_r4.middleware.ResilienceMiddleware`: any running detector counts
    (one started by :func:`monitor_asgi`, or your own), so a loop is never watched twice. A started one
    ends by itself when its loop closes. ``threshold=None`` takes the ``stall_detector`` setting's.
    """
    if loop is None:
        loop = asyncio.get_running_loop()
    with _ensure_lock:
        for detector in get_detectors():
            if detector.loop is loop and detector.running:
                return detector
        if threshold is None:
            threshold = configured_options().threshold_ns / 1e9
        return StallDetector(threshold, name=name, **detector_kwargs).start(loop)


class StallMonitor:
    """ASGI wrapper that starts one :class:`StallDetector` per event loop on its first call.

    Built by :func:`monitor_asgi`. Any scope type (lifespan, http, websocket) starts it; later calls
    on the same loop cost one identity check.
    """

    def __init__(self, application: ASGIApp, **detector_kwargs: Any) -> None:
        self.application = application
        self._detector_kwargs = detector_kwargs
        self._loop: asyncio.AbstractEventLoop | None = None
        self._detectors: list[StallDetector] = []
        self._lock = threading.Lock()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Ensure a detector watches the running loop, then delegate to the wrapped application."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._ensure(loop)
        await self.application(scope, receive, send)

    @property
    def detectors(self) -> list[StallDetector]:
        """The detectors this wrapper started that are still running."""
        with self._lock:
            return [d for d in self._detectors if d.running]

    def _ensure(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            if self._detector_kwargs.get("threshold") is None:  # monitor_asgi() without a threshold
                self._detector_kwargs["threshold"] = configured_options().threshold_ns / 1e9
            # Detectors of closed loops end on their own; drop them so they can be collected.
            self._detectors = [d for d in self._detectors if d.running]
            if not any(d.loop is loop for d in self._detectors):
                self._detectors.append(StallDetector(**self._detector_kwargs).start(loop))
            self._loop = loop

    def stop(self) -> None:
        """Stop every detector this wrapper started (for tests and orderly shutdown)."""
        with self._lock:
            detectors, self._detectors, self._loop = self._detectors, [], None
        for detector in detectors:
            detector.stop()


def monitor_asgi(
    application: ASGIApp,
    threshold: float | str | timedelta | None = None,
    **detector_kwargs: Any,
) -> StallMonitor:
    """Wrap an ASGI application so its event loop is watched for stalls (always, whatever ``enabled`` says).

    ``application = monitor_asgi(get_asgi_application())`` in ``asgi.py``. ``threshold=None`` takes
    ``RATELIMIT_R4["stall_detector"]["threshold"]`` (default 20 ms), read at the first call, never at
    import. Extra keyword arguments (``interval``, ``logger``, ``on_stall``, ``hang_report_after``,
    ``name``) go to each :class:`StallDetector`; an explicit threshold is validated now.
    """
    if threshold is not None:
        _to_seconds(threshold, "threshold")
    detector_kwargs.setdefault("name", "asgi")
    return StallMonitor(application, threshold=threshold, **detector_kwargs)
