"""Per-instance event publishing, Resilience4j style.

Each primitive owns an :class:`EventPublisher` subclass with explicit ``on_<type>(fn)`` methods.
Primitives check :attr:`EventPublisher.has_listeners` (a plain attribute) before building an event,
so an instance nobody listens to pays one attribute read per call. A listener that raises is logged
and skipped: it never breaks the protected call.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, Generic, TypeVar

__all__ = ["Event", "EventPublisher"]

logger = logging.getLogger("django_ratelimit_r4.events")


@dataclass(frozen=True, slots=True)
class Event:
    """Base of every event: the event type, the instance name and when it happened (epoch seconds)."""

    event_type: str
    name: str
    created_at: float = field(default_factory=time.time)


E = TypeVar("E", bound=Event)
Listener = Callable[[E], object]


class EventPublisher(Generic[E]):
    """Holds listeners per event type. Subclasses list their types in ``EVENT_TYPES``.

    A subclass that keeps per-type flags (so the hot path reads one attribute) refreshes them in
    :meth:`_listeners_changed`, the one hook called after every registration and removal.
    """

    EVENT_TYPES: ClassVar[tuple[str, ...]] = ()

    __slots__ = ("_by_type", "_catch_all", "has_listeners")

    def __init__(self) -> None:
        self._by_type: dict[str, list[Callable[[E], object]]] = {}
        self._catch_all: list[Callable[[E], object]] = []
        #: True once any listener is registered; primitives test it before building events.
        self.has_listeners = False

    def on_event(self, listener: Callable[[E], object]) -> Callable[[E], object]:
        """Register ``listener`` for every event type. Returns it, so it works as a decorator."""
        self._catch_all.append(listener)
        self.has_listeners = True
        self._listeners_changed()
        return listener

    def _on(self, event_type: str, listener: Callable[[E], object]) -> Callable[[E], object]:
        if event_type not in self.EVENT_TYPES:
            raise ValueError(f"unknown event type {event_type!r}; known: {', '.join(self.EVENT_TYPES)}")
        self._by_type.setdefault(event_type, []).append(listener)
        self.has_listeners = True
        self._listeners_changed()
        return listener

    def remove_listener(self, listener: Callable[[E], object]) -> None:
        """Unregister ``listener`` from every type it was registered for."""
        if listener in self._catch_all:
            self._catch_all.remove(listener)
        for listeners in self._by_type.values():
            while listener in listeners:
                listeners.remove(listener)
        self.has_listeners = bool(self._catch_all) or any(self._by_type.values())
        self._listeners_changed()

    def _listeners_changed(self) -> None:
        """Hook run after every ``on_*`` and ``remove_listener``: recompute derived flags here."""

    def wants(self, event_type: str) -> bool:
        """True if publishing an event of ``event_type`` would reach a listener."""
        return bool(self._catch_all) or bool(self._by_type.get(event_type))

    def publish(self, event: E) -> None:
        """Deliver ``event`` to its listeners; a listener's exception is logged, never raised."""
        for listener in (*self._by_type.get(event.event_type, ()), *self._catch_all):
            try:
                listener(event)
            except Exception:
                logger.exception("event listener %r failed on %s event of %r", listener, event.event_type, event.name)
