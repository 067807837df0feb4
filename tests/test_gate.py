"""``RateLimitGate`` (django_ratelimit_r4/gate.py) on its own: the check behind @ratelimit and the DRF throttle."""

from __future__ import annotations

import pytest
from django.test import RequestFactory

from django_ratelimit_r4.core.exceptions import RequestNotPermitted
from django_ratelimit_r4.gate import RateLimitGate
from tests.cyclic import cyclic_garbage

pytestmark = pytest.mark.django_db(databases=[])


def test_check_computes_each_key_once_on_a_rejection(r4_clock) -> None:
    """A rejected ``check()`` reuses the keys of its decision for the header fields (it computed them twice)."""
    calls: list[str] = []

    def key(request) -> str:
        calls.append(request.path)
        return "client"

    gate = RateLimitGate("per_ip", key=key)  # 2 per period
    request = RequestFactory().get("/k")
    for _ in range(2):
        assert gate.check(request)[0] is None
    calls.clear()
    rejection, headers = gate.check(request)
    assert isinstance(rejection, RequestNotPermitted)
    assert calls == ["/k"]
    assert headers["RateLimit"].startswith('"per_ip";r=0;t=')


def test_check_computes_each_key_once_over_several_limits(r4_clock) -> None:
    calls: list[str] = []

    def key(request) -> str:
        calls.append(request.path)
        return "client"

    gate = RateLimitGate(["per_ip", "api"], key=key)
    request = RequestFactory().get("/k")
    for _ in range(2):
        assert gate.check(request)[0] is None
    calls.clear()
    rejection, headers = gate.check(request)
    assert isinstance(rejection, RequestNotPermitted)
    assert calls == ["/k", "/k"]  # one call per limit, not two
    assert headers["RateLimit"].count(";r=") == 2


def test_a_new_gate_resolves_at_its_first_use(r4_clock) -> None:
    """The gate starts with a complete plan of no limits that never matches a registry generation."""
    gate = RateLimitGate("api")
    assert gate._plan.limits == () and gate._plan.generation < 0
    assert gate.plan().limits[0].name == "api"


def test_a_service_function_rejection_without_fallback_skips_the_handler(monkeypatch) -> None:
    """Item 9: an OPEN breaker's rejection of a plain call is re-raised at once (no handle()/owns() calls);
    a view still gets its 503 and a fallback still runs."""
    from django.http import HttpResponse

    from django_ratelimit_r4 import get_circuit_breaker
    from django_ratelimit_r4.core.exceptions import CallNotPermitted
    from django_ratelimit_r4.decorators import _Resilience, circuitbreaker

    handled: list[BaseException] = []
    original = _Resilience.handle

    def spy(self, fn, exc, args, kwargs):
        handled.append(exc)
        return original(self, fn, exc, args, kwargs)

    monkeypatch.setattr(_Resilience, "handle", spy)
    get_circuit_breaker("acquirer").transition_to_open_state()
    try:
        service = circuitbreaker("acquirer")(lambda amount: amount)
        with pytest.raises(CallNotPermitted):
            service(1)
        assert handled == []
        view = circuitbreaker("acquirer")(lambda request: HttpResponse("ok"))
        assert view(RequestFactory().get("/")).status_code == 503
        with_fallback = circuitbreaker("acquirer", fallback=lambda amount, exc: "cached")(lambda amount: amount)
        assert with_fallback(1) == "cached"
        assert len(handled) == 2
    finally:
        get_circuit_breaker("acquirer").reset()


@pytest.mark.parametrize("key", ["ip", lambda request: "client"])
def test_check_keyed_fast_path_writes_what_the_general_path_reads(r4_clock, key) -> None:
    """``check()`` (the DRF throttle) on one in-memory keyed limit decides and reads the figures in one locked
    step from the client's cached constants: its fields are exactly what the general path formats from
    ``quota()`` right after (the FakeClock does not move), allowed and rejected."""
    gate = RateLimitGate("per_ip", key=key)  # 2 per period
    plan = gate.plan()
    assert plan.keyed_acquire_quota is not None  # the path under test
    request = RequestFactory().get("/k", REMOTE_ADDR="198.51.100.7")
    for rejected in (False, False, True, True):
        rejection, headers = gate.check(request)
        assert isinstance(rejection, RequestNotPermitted) is rejected
        assert headers == gate._headers(plan, gate._keys(plan, request))


def test_check_keyed_fast_path_lets_an_exempt_request_through(r4_clock) -> None:
    gate = RateLimitGate("per_ip", key=lambda request: None)
    assert gate.plan().keyed_acquire_quota is not None
    request = RequestFactory().get("/k")
    for _ in range(5):
        assert gate.check(request) == (None, {})


@pytest.mark.parametrize("key", [None, "ip"])
def test_check_returns_its_rejection_without_a_traceback(r4_clock, key) -> None:
    """A returned (not raised) rejection carries no traceback: its frames link back to every caller, and a
    caller holding it (the DRF throttle does) would make a reference cycle left to the cyclic GC."""
    gate = RateLimitGate("per_ip", key=key)
    request = RequestFactory().get("/k", REMOTE_ADDR="198.51.100.9")
    while (rejection := gate.check(request)[0]) is None:
        pass
    assert isinstance(rejection, RequestNotPermitted) and rejection.__traceback__ is None


@pytest.mark.parametrize("drf", [False, True], ids=["decorator", "DRF throttle"])
def test_an_in_memory_keyed_429_leaves_nothing_to_the_cyclic_gc(r4_clock, drf) -> None:
    """The rejection carries its figures (rejection_quotas) and is raised with no local holding it, so its
    traceback closes no reference cycle through a frame (the request and response would wait for the GC)."""
    from django.http import HttpResponse

    from django_ratelimit_r4.decorators import ratelimit

    if drf:
        from rest_framework.response import Response
        from rest_framework.views import APIView

        from django_ratelimit_r4.rest_framework import RateLimiterThrottle

        class View(APIView):
            throttle_classes = [RateLimiterThrottle]
            rate_limiter = "per_ip"

            def get(self, request):
                return Response({"ok": True})

        view = View.as_view()
    else:
        view = ratelimit("per_ip")(lambda request: HttpResponse("ok"))
    factory = RequestFactory()

    def requests() -> None:
        for _ in range(4):
            response = view(factory.get("/", REMOTE_ADDR="198.51.100.77"))
        assert response.status_code == 429
        assert response["RateLimit"].startswith('"per_ip";r=0;t=')

    left = cyclic_garbage(requests)
    assert not [o for o in left if isinstance(o, RequestNotPermitted) or type(o).__name__ in ("frame", "traceback")]


async def test_a_lazy_user_without_auser_is_read_in_a_thread_not_on_the_loop() -> None:
    """A middleware of one's own may set a lazy ``request.user`` and no ``auser``: it is read off the loop."""
    import threading

    from django.http import HttpRequest
    from django.utils.functional import SimpleLazyObject

    from django_ratelimit_r4.gate import _aload_user

    read_on: list[int] = []

    class User:
        is_authenticated = True
        pk = 7

    def load() -> User:
        read_on.append(threading.get_ident())
        return User()

    request = HttpRequest()
    request.user = SimpleLazyObject(load)  # type: ignore[assignment]
    await _aload_user(request)
    assert read_on and read_on[0] != threading.get_ident()
    await _aload_user(request)  # already read: nothing more
    assert len(read_on) == 1 and request.user.pk == 7


async def test_a_user_that_is_not_lazy_is_left_alone() -> None:
    from django.http import HttpRequest

    from django_ratelimit_r4.gate import _aload_user

    request = HttpRequest()
    marker = object()
    request.user = marker  # type: ignore[assignment]
    await _aload_user(request)
    assert request.user is marker
    del request.user
    await _aload_user(request)  # no user at all (no AuthenticationMiddleware): nothing to do
    assert not hasattr(request, "user")
