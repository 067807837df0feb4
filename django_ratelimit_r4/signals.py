"""Django signals for circuit-breaker state transitions and rejected calls.

``state_transition``
    ``sender``: the :class:`~django_ratelimit_r4.core.circuitbreaker.CircuitBreaker`; keyword
    arguments ``name`` (str), ``from_state`` and ``to_state`` (state names: ``"CLOSED"``, ``"OPEN"``,
    ``"HALF_OPEN"``, ``"FORCED_OPEN"``, ``"DISABLED"``, ``"METRICS_ONLY"``). Sent for every change of
    state, automatic or manual (internal X -> X transitions are not changes).
``call_rejected``
    ``sender``: the rejecting instance (``RateLimiter``, ``KeyedRateLimiter``, ``Bulkhead`` or
    ``CircuitBreaker``); keyword arguments ``name``, ``kind`` (``"ratelimiter"``, ``"bulkhead"``,
    ``"circuitbreaker"``) and ``wait_ns``: the instance's wait when the signal is sent (the rate
    limiter's ``nanos_to_wait``, the breaker's remaining open time), or ``None`` when there is no
    single answer (a keyed limiter: the key is never passed on; a bulkhead). As in Resilience4j, a
    FORCED_OPEN or DISABLED breaker publishes no rejection events, so no signal either.

Receivers run synchronously, in the thread (or on the event loop) of the rejected call: keep them
short. Signals are sent with ``send_robust``: a receiver that raises is logged (``django.dispatch``
logger, with its traceback) and never breaks the protected call.

Only instances of ``settings.RATELIMIT_R4`` (the registry) send signals. Nothing is paid while no
receiver is connected: the primitives' events are subscribed when the first receiver of a signal
connects, and unsubscribed when the last one disconnects (a breaker or bulkhead with any listener
builds an event per call; a rate limiter only on rejections).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from django.dispatch import Signal

from . import registry

__all__ = ["call_rejected", "state_transition"]

logger = logging.getLogger("django_ratelimit_r4.signals")


class _WiredSignal(Signal):
    """A Signal that (un)subscribes the primitives' events as receivers come and go."""

    def connect(self, *args: Any, **kwargs: Any) -> None:
        """See :meth:`django.dispatch.Signal.connect`; also subscribes the primitives' events."""
        super().connect(*args, **kwargs)
        _rewire()

    def disconnect(self, *args: Any, **kwargs: Any) -> bool:
        """See :meth:`django.dispatch.Signal.disconnect`; unsubscribes events nobody needs any more."""
        disconnected = bool(super().disconnect(*args, **kwargs))
        _rewire()
        return disconnected


#: A circuit breaker changed state. Keyword arguments: ``name``, ``from_state``, ``to_state``.
state_transition = _WiredSignal()
#: A call was turned away. Keyword arguments: ``name``, ``kind``, ``wait_ns`` (int or None).
call_rejected = _WiredSignal()


def _send(signal: Signal, sender: Any, **kwargs: Any) -> None:
    # send_robust catches receivers' exceptions; this also covers what it does not (e.g. an async
    # receiver reached from a running event loop, where async_to_sync refuses to run).
    try:
        signal.send_robust(sender, **kwargs)
    except Exception:
        logger.exception(
            "sending %s for %r failed",
            "state_transition" if signal is state_transition else "call_rejected",
            kwargs.get("name"),
        )


class _Relay:
    """Turns one instance's events into signals; remembers which listeners it registered."""

    __slots__ = ("generation", "instance", "subscribed", "type_name", "wait")

    def __init__(self, type_name: str, instance: Any, generation: int) -> None:
        self.type_name = type_name
        self.instance = instance
        self.generation = generation
        self.subscribed: set[str] = set()
        self.wait = _wait_reader(type_name, instance)

    def on_transition(self, event: Any) -> None:
        _send(
            state_transition,
            self.instance,
            name=event.name,
            from_state=event.from_state.name,
            to_state=event.to_state.name,
        )

    def on_rejected(self, event: Any) -> None:
        _send(call_rejected, self.instance, name=event.name, kind=self.type_name, wait_ns=self.wait())

    def sync(self, transitions: bool, rejections: bool) -> None:
        """Subscribe or unsubscribe so the instance publishes only what a receiver wants."""
        events = self.instance.events
        if self.type_name == "circuitbreaker":
            self._set("transition", transitions, events.on_state_transition, self.on_transition)
            self._set("rejected", rejections, events.on_not_permitted, self.on_rejected)
        elif self.type_name == "ratelimiter":
            # Only the failed-acquire flag flips: the allowed path keeps paying nothing.
            self._set("rejected", rejections, events.on_failed_acquire, self.on_rejected)
        elif self.type_name == "bulkhead":
            self._set("rejected", rejections, events.on_call_rejected, self.on_rejected)

    def _set(self, what: str, wanted: bool, subscribe: Any, listener: Any) -> None:
        if wanted and what not in self.subscribed:
            subscribe(listener)
            self.subscribed.add(what)
        elif not wanted and what in self.subscribed:
            self.instance.events.remove_listener(listener)
            self.subscribed.discard(what)


def _wait_reader(type_name: str, instance: Any) -> Any:
    if type_name == "circuitbreaker":
        return instance.remaining_open_ns
    backend = getattr(instance, "backend", None) if type_name == "ratelimiter" else None
    if backend is not None:
        return lambda: backend.state()[2]
    return lambda: None


#: Section -> type of the primitives that send signals (retries and time limiters send none).
_SIGNAL_TYPES = {s: registry.SECTIONS[s].type_name for s in ("ratelimiters", "bulkheads", "circuitbreakers")}
_lock = threading.RLock()
#: id(instance) -> relay, for every signal-capable instance seen in the current registry generation.
_relays: dict[int, _Relay] = {}
_scanned = False


def _wanted() -> tuple[bool, bool]:
    return bool(state_transition.receivers), bool(call_rejected.receivers)


def _track(section: str, name: str, instance: Any) -> None:
    """Build callback (and initial scan): relay this instance's events while receivers exist."""
    type_name = _SIGNAL_TYPES.get(section)
    if type_name is None:
        return  # retries and time limiters send no signals
    try:
        with _lock:
            generation = registry.generation
            for key in [k for k, r in _relays.items() if r.generation != generation]:
                _relays.pop(key).sync(False, False)  # a replaced setting's instance: stop relaying
            relay = _relays.get(id(instance))
            if relay is None or relay.instance is not instance:
                relay = _relays[id(instance)] = _Relay(type_name, instance, generation)
            relay.sync(*_wanted())
    except Exception:  # never break the registry's build
        logger.exception("could not wire signals for %s %r", type_name, name)


def _rewire() -> None:
    """Bring every known instance's subscriptions in line with the connected receivers."""
    global _scanned
    wanted = _wanted()
    if not _scanned and any(wanted):
        # Instances built before this module was imported never went through the build callback.
        # Collected outside _lock: building takes the registry lock, which then takes _lock.
        try:
            found = list(registry.iter_instances())
            found += [("ratelimiters", name, keyed) for name, keyed in registry.keyed_rate_limiters()]
        except Exception:  # settings not usable yet: later builds are still wired by the callback
            logger.debug("signals: registry not readable yet", exc_info=True)
            found = []
        else:
            _scanned = True
        for section, name, instance in found:
            _track(section, name, instance)
    with _lock:
        generation = registry.generation
        for key, relay in list(_relays.items()):
            if relay.generation != generation:
                del _relays[key]
                relay.sync(False, False)
            else:
                relay.sync(*wanted)


registry.build_callbacks.append(_track)
