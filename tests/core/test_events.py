"""EventPublisher: typed and catch-all listeners, has_listeners, removal, and listener errors logged."""

from __future__ import annotations

import dataclasses
import logging
import time

import pytest

from django_ratelimit_r4.core.events import Event, EventPublisher


class DemoEvents(EventPublisher[Event]):
    __slots__ = ()
    EVENT_TYPES = ("A", "B")

    def on_a(self, listener):  # type: ignore[no-untyped-def]
        return self._on("A", listener)

    def on_b(self, listener):  # type: ignore[no-untyped-def]
        return self._on("B", listener)


def test_event_fields_and_immutability() -> None:
    before = time.time()
    event = Event("A", "inst")
    assert (event.event_type, event.name) == ("A", "inst")
    assert before <= event.created_at <= time.time()
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.name = "other"  # type: ignore[misc]


def test_has_listeners_tracks_registration_and_removal() -> None:
    events = DemoEvents()
    assert events.has_listeners is False
    typed = events.on_a(lambda e: None)
    assert events.has_listeners is True
    events.remove_listener(typed)
    assert events.has_listeners is False
    catch_all = events.on_event(lambda e: None)
    assert events.has_listeners is True
    events.remove_listener(catch_all)
    assert events.has_listeners is False


def test_typed_listeners_receive_their_type_and_catch_all_receives_everything() -> None:
    events = DemoEvents()
    seen: list[tuple[str, str]] = []
    events.on_a(lambda e: seen.append(("a", e.event_type)))
    events.on_b(lambda e: seen.append(("b", e.event_type)))
    events.on_event(lambda e: seen.append(("all", e.event_type)))
    events.publish(Event("A", "x"))
    events.publish(Event("B", "x"))
    assert seen == [("a", "A"), ("all", "A"), ("b", "B"), ("all", "B")]


def test_registration_returns_the_listener_so_it_works_as_a_decorator() -> None:
    events = DemoEvents()
    received: list[Event] = []

    @events.on_a
    def listener(event: Event) -> None:
        received.append(event)

    assert callable(listener)
    events.publish(Event("A", "x"))
    assert len(received) == 1


def test_remove_listener_removes_it_from_every_type() -> None:
    events = DemoEvents()
    calls: list[str] = []

    def listener(event: Event) -> None:
        calls.append(event.event_type)

    other = events.on_b(lambda e: calls.append("other"))
    events.on_a(listener)
    events.on_a(listener)
    events.on_b(listener)
    events.on_event(listener)
    events.remove_listener(listener)
    events.publish(Event("A", "x"))
    events.publish(Event("B", "x"))
    assert calls == ["other"]
    assert events.has_listeners is True
    events.remove_listener(other)
    assert events.has_listeners is False
    events.remove_listener(listener)  # removing an unknown listener is a no-op


def test_bound_methods_can_be_removed() -> None:
    class Sink:
        def __init__(self) -> None:
            self.events: list[Event] = []

        def receive(self, event: Event) -> None:
            self.events.append(event)

    sink = Sink()
    events = DemoEvents()
    events.on_a(sink.receive)
    events.remove_listener(sink.receive)  # a new bound-method object, equal to the registered one
    events.publish(Event("A", "x"))
    assert sink.events == [] and events.has_listeners is False


def test_unknown_event_type_is_an_error_listing_known_types() -> None:
    events = DemoEvents()
    with pytest.raises(ValueError, match=r"unknown event type 'C'; known: A, B"):
        events._on("C", lambda e: None)
    assert events.has_listeners is False


def test_wants() -> None:
    events = DemoEvents()
    assert not events.wants("A")
    events.on_b(lambda e: None)
    assert not events.wants("A") and events.wants("B")
    events.on_event(lambda e: None)
    assert events.wants("A")


def test_a_failing_listener_is_logged_and_the_others_still_run(caplog: pytest.LogCaptureFixture) -> None:
    events = DemoEvents()
    received: list[str] = []

    def broken(event: Event) -> None:
        raise RuntimeError("listener bug")

    events.on_a(broken)
    events.on_a(lambda e: received.append("typed"))
    events.on_event(broken)
    events.on_event(lambda e: received.append("all"))
    with caplog.at_level(logging.ERROR, logger="django_ratelimit_r4.events"):
        events.publish(Event("A", "inst"))  # does not raise
    assert received == ["typed", "all"]
    failures = [r for r in caplog.records if r.name == "django_ratelimit_r4.events"]
    assert len(failures) == 2
    assert all(r.exc_info and isinstance(r.exc_info[1], RuntimeError) for r in failures)
    assert "'inst'" in failures[0].getMessage() and "A event" in failures[0].getMessage()


def test_publish_without_listeners_does_nothing(caplog: pytest.LogCaptureFixture) -> None:
    events = DemoEvents()
    seen: list[Event] = []
    events.on_b(seen.append)
    assert events.wants("A") is False and events.wants("B") is True
    with caplog.at_level(logging.DEBUG, logger="django_ratelimit_r4.events"):
        events.publish(Event("A", "x"))  # no listener of A: nothing is called, nothing logged
    assert seen == [] and caplog.records == []


def test_publishers_are_independent() -> None:
    first, second = DemoEvents(), DemoEvents()
    first.on_a(lambda e: None)
    assert first.has_listeners and not second.has_listeners


def test_one_hook_sees_every_registration_and_removal() -> None:
    """Subclasses keep derived flags through one hook, not by overriding on_event, _on and remove_listener."""
    seen: list[bool] = []

    class Flagged(DemoEvents):
        __slots__ = ()

        def _listeners_changed(self) -> None:
            seen.append(self.wants("A"))

    events = Flagged()
    assert seen == []

    def listener(e: Event) -> None:
        return None

    events.on_a(listener)
    events.remove_listener(listener)
    events.on_event(listener)
    events.remove_listener(listener)
    events.on_b(listener)
    assert seen == [True, False, True, False, False]
