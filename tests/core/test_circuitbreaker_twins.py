"""``CircuitBreaker.call`` and ``acall`` are twins: both inline the hot paths, so they are kept in step here.

Two proofs: their syntax trees are identical once ``await`` is removed (so a fix to one that is not made to
the other fails at once), and the same scenarios through both end in the same state, metrics and events.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import textwrap
from collections.abc import Callable
from typing import Any

import pytest

from django_ratelimit_r4.core.circuitbreaker import CircuitBreaker, CircuitBreakerConfig
from django_ratelimit_r4.core.clock import FakeClock
from django_ratelimit_r4.core.events import Event
from django_ratelimit_r4.core.exceptions import CallNotPermitted


class _Unawait(ast.NodeTransformer):
    def visit_Await(self, node: ast.Await) -> ast.AST:
        return self.visit(node.value)


def _shape(method: Callable[..., Any]) -> tuple[str, str, int]:
    """(body without docstring or await, parameters without annotations, number of awaits)."""
    fn = ast.parse(textwrap.dedent(inspect.getsource(method))).body[0]
    assert isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
    awaits = sum(isinstance(node, ast.Await) for node in ast.walk(fn))
    body = fn.body[1:] if ast.get_docstring(fn) is not None else fn.body
    body = [_Unawait().visit(stmt) for stmt in body]
    args = fn.args
    for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
        if arg is not None:
            arg.annotation = None
    return ast.dump(ast.Module(body=body, type_ignores=[])), ast.dump(args), awaits


def test_call_and_acall_differ_only_in_the_await():
    sync_body, sync_args, sync_awaits = _shape(CircuitBreaker.call)
    async_body, async_args, async_awaits = _shape(CircuitBreaker.acall)
    assert (sync_awaits, async_awaits) == (0, 1)  # acall awaits the protected call, nothing else
    assert sync_args == async_args
    assert sync_body == async_body, "call() and acall() diverged: make the same change to both"


class Boom(Exception):
    pass


class Ignored(Exception):
    pass


# Each step: (what the protected call does, seconds it takes, seconds to advance before the call).
SCENARIO = [
    ("ok", 0.0, 0.0),
    ("ok", 2.0, 0.0),  # slow success
    ("boom", 0.0, 0.0),
    ("ignored", 0.0, 0.0),
    ("boom", 2.0, 0.0),  # slow failure
    ("ok", 0.0, 0.0),
    ("ok", 0.0, 0.0),  # window full: the inlined fast path from here while calls stay plain
    ("ok", 0.0, 0.0),
    ("ok", 0.0, 0.0),
    ("boom", 0.0, 0.0),
    ("boom", 0.0, 0.0),  # failure rate reaches 50 %: OPEN
    ("ok", 0.0, 0.0),  # rejected
    ("ok", 0.0, 11.0),  # after the wait: HALF_OPEN trial
    ("ok", 0.0, 0.0),  # second trial succeeds: CLOSED
    ("result-fail", 0.0, 0.0),
    ("ok", 0.0, 0.0),
]


def _config(record_result: bool) -> CircuitBreakerConfig:
    return CircuitBreakerConfig(
        sliding_window_size=4,
        minimum_number_of_calls=4,
        slow_call_duration_threshold="1s",
        wait_duration_in_open_state="10s",
        permitted_number_of_calls_in_half_open_state=2,
        ignore_exceptions=(Ignored,),
        record_result=(lambda r: r == "bad") if record_result else None,
    )


def _outcome(clock: FakeClock, what: str, takes: float) -> str:
    clock.advance(takes)
    if what == "boom":
        raise Boom
    if what == "ignored":
        raise Ignored
    return "bad" if what == "result-fail" else "fine"


def _event_view(event: Event) -> tuple[Any, ...]:
    fields = {k: getattr(event, k) for k in getattr(event, "__slots__", ()) if k != "created_at"}
    if "exception" in fields:
        fields["exception"] = type(fields["exception"]).__name__
    return (event.event_type, event.name, tuple(sorted(fields.items(), key=lambda kv: kv[0])))


def _observe(cb: CircuitBreaker, outcomes: list[str], events: list[Event]) -> tuple[Any, ...]:
    m = cb.metrics
    return (
        cb.state,
        m.failure_rate,
        m.slow_call_rate,
        m.number_of_buffered_calls,
        m.number_of_failed_calls,
        m.number_of_slow_calls,
        m.number_of_slow_failed_calls,
        m.number_of_not_permitted_calls,
        m.total_successful_calls,
        m.total_successful_duration_ns,
        m.total_failed_calls,
        m.total_failed_duration_ns,
        m.total_ignored_calls,
        m.total_not_permitted_calls,
        tuple(outcomes),
        tuple(_event_view(e) for e in events),
    )


def _through_call(listen: bool, record_result: bool) -> list[tuple[Any, ...]]:
    clock = FakeClock()
    cb = CircuitBreaker("twin", _config(record_result), clock=clock)
    events: list[Event] = []
    if listen:
        cb.events.on_event(events.append)
    outcomes: list[str] = []
    seen = []
    for what, takes, before in SCENARIO:
        clock.advance(before)
        try:
            outcomes.append(cb.call(_outcome, clock, what, takes))
        except (Boom, Ignored, CallNotPermitted) as exc:
            outcomes.append(type(exc).__name__)
        seen.append(_observe(cb, outcomes, events))
    return seen


def _through_acall(listen: bool, record_result: bool) -> list[tuple[Any, ...]]:
    clock = FakeClock()
    cb = CircuitBreaker("twin", _config(record_result), clock=clock)
    events: list[Event] = []
    if listen:
        cb.events.on_event(events.append)
    outcomes: list[str] = []
    seen = []

    async def protected(what: str, takes: float) -> str:
        return _outcome(clock, what, takes)

    async def scenario() -> None:
        for what, takes, before in SCENARIO:
            clock.advance(before)
            try:
                outcomes.append(await cb.acall(protected, what, takes))
            except (Boom, Ignored, CallNotPermitted) as exc:
                outcomes.append(type(exc).__name__)
            seen.append(_observe(cb, outcomes, events))

    asyncio.run(scenario())
    return seen


@pytest.mark.parametrize("listen", [False, True], ids=["no-listeners", "listeners"])
@pytest.mark.parametrize("record_result", [False, True], ids=["plain", "record-result"])
def test_same_scenario_same_state_metrics_and_events(listen, record_result):
    sync_seen = _through_call(listen, record_result)
    async_seen = _through_acall(listen, record_result)
    assert sync_seen == async_seen
    final = sync_seen[-1]
    assert "CallNotPermitted" in final[14]  # the scenario did reach OPEN and reject
    if listen:
        assert {view[0] for view in final[15]} >= {"SUCCESS", "ERROR", "IGNORED_ERROR", "STATE_TRANSITION"}
