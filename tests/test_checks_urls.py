"""`manage.py check` knows the instance names routed views use: decorators, method_decorator on class-based
views, DRF throttles on APIViews and ViewSets. Unknown names are errors with a did-you-mean, found before the
first request; the first request itself raises a clear ImproperlyConfigured, never a fallback or a 500 that
hides the cause."""

from __future__ import annotations

import copy
import io
import re
import sys
import types
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.middleware import AuthenticationMiddleware
from django.contrib.sessions.backends.cache import SessionStore
from django.contrib.sessions.middleware import SessionMiddleware
from django.core.checks import Warning as CheckWarning
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.http import HttpRequest, HttpResponse
from django.test import Client
from django.urls import URLResolver, include, path
from django.urls.resolvers import RoutePattern
from django.utils.decorators import method_decorator
from django.views import View
from rest_framework import routers, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.views import APIView

from django_ratelimit_r4.backends.memory import MemoryBackend, MemoryStore
from django_ratelimit_r4.checks import check_url_names
from django_ratelimit_r4.decorators import bulkhead, circuitbreaker, ratelimit, resilient, retry, timelimiter
from django_ratelimit_r4.rest_framework import AnonRateThrottle, RateLimiterThrottle, UserRateThrottle

pytestmark = pytest.mark.django_db(databases=[])


def ok(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit("apii")
def typo_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse("never")


@ratelimit("apii", fallback=lambda request, exc: HttpResponse("fallback"))
def typo_with_fallback(request: HttpRequest) -> HttpResponse:
    return HttpResponse("never")


@bulkhead("acquier")
def bulkhead_typo(request: HttpRequest) -> HttpResponse:
    return HttpResponse("never")


@circuitbreaker("acquirre")
def breaker_typo(request: HttpRequest) -> HttpResponse:
    return HttpResponse("never")


@retry("acquirer")
@ratelimit(["api", "slwo"])
def stacked_typo(request: HttpRequest) -> HttpResponse:
    return HttpResponse("never")


@timelimiter("acquire")
async def timelimiter_typo(request: HttpRequest) -> HttpResponse:
    return HttpResponse("never")


@resilient(retry="acquirer", circuitbreaker="payments", ratelimiter="api", bulkhead="acquirer")
def resilient_typo(request: HttpRequest) -> HttpResponse:
    return HttpResponse("never")


@ratelimit("api")
@circuitbreaker("acquirer")
def all_known(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@method_decorator(ratelimit("dispatch_typo"), name="dispatch")
class DispatchTypo(View):
    def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("never")


class MethodTypo(View):
    @method_decorator([ratelimit("list_typo_a"), bulkhead("list_typo_b")])
    def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("never")


class DrfNamed(APIView):
    throttle_classes = [RateLimiterThrottle]
    rate_limiter = "apii"

    def get(self, request: Any) -> Response:
        return Response({})


class DrfScopeTypo(APIView):
    throttle_classes = [RateLimiterThrottle]
    throttle_scope = "slwo"

    def get(self, request: Any) -> Response:
        return Response({})


class DrfAnonWithoutRate(APIView):
    throttle_classes = [AnonRateThrottle]

    def get(self, request: Any) -> Response:
        return Response({})


class DrfMethodDecorated(APIView):
    @method_decorator(circuitbreaker("drf_breaker_typo"))
    def get(self, request: Any) -> Response:
        return Response({})


class Things(viewsets.ViewSet):
    throttle_classes = [RateLimiterThrottle]
    rate_limiter = "api"

    def list(self, request: Any) -> Response:
        return Response([])

    @action(detail=False, throttle_classes=[RateLimiterThrottle], rate_limiter="viewset_action_typo")
    def recent(self, request: Any) -> Response:
        return Response([])


class OddPattern:
    """Something in urlpatterns that is neither a URLPattern nor a URLResolver."""

    pattern = "odd/"


def urlconf(*patterns: Any) -> types.ModuleType:
    module = types.ModuleType("names_check_urls")
    module.urlpatterns = list(patterns)  # type: ignore[attr-defined]
    return module


def everything() -> types.ModuleType:
    router = routers.SimpleRouter()
    router.register("things", Things, basename="things")
    nested = urlconf(path("typo/", typo_view), path("fine/", all_known))
    return urlconf(
        path("ok/", ok),
        path("bulkhead/", bulkhead_typo),
        path("breaker/", breaker_typo),
        path("stacked/", stacked_typo),
        path("timelimiter/", timelimiter_typo),
        path("resilient/", resilient_typo),
        path("dispatch/", DispatchTypo.as_view()),
        path("method/", MethodTypo.as_view()),
        path("drf-named/", DrfNamed.as_view()),
        path("drf-scope/", DrfScopeTypo.as_view()),
        path("drf-anon/", DrfAnonWithoutRate.as_view()),
        path("drf-method/", DrfMethodDecorated.as_view()),
        path("api/", include(router.urls)),
        path("nested/", include(nested)),
        path("again/", typo_view),  # the same name twice: one message naming both places
    )


def messages_for(settings: Any, module: types.ModuleType) -> dict[str, Any]:
    settings.ROOT_URLCONF = module
    return {m.msg: m for m in check_url_names()}


def test_every_unknown_name_is_reported_once_with_where_and_did_you_mean(settings: Any) -> None:
    found = messages_for(settings, everything())
    name_re = re.compile(r"(?:uses \w+|throttle_scope) '([^']+)'")
    by_name = {name_re.search(msg).group(1): m for msg, m in found.items() if m.is_serious()}
    expected_errors = {
        "apii": ("ratelimiter", "Did you mean 'api'?"),
        "acquier": ("bulkhead", "Did you mean 'acquirer'?"),
        "acquirre": ("circuitbreaker", "Did you mean 'acquirer'?"),
        "slwo": ("ratelimiter", "Did you mean 'slow'?"),
        "acquire": ("timelimiter", "Did you mean 'acquirer'?"),
        "payments": ("circuitbreaker", None),
        "dispatch_typo": ("ratelimiter", None),
        "list_typo_a": ("ratelimiter", None),
        "list_typo_b": ("bulkhead", None),
        "drf_breaker_typo": ("circuitbreaker", None),
        "viewset_action_typo": ("ratelimiter", None),
        "anon": ("ratelimiter", None),
    }
    errors = by_name
    assert set(errors) == set(expected_errors), sorted(by_name)
    for name, (type_name, hint) in expected_errors.items():
        message = errors[name]
        assert message.id == "ratelimit_r4.E024", message
        assert f"uses {type_name} '{name}'" in message.msg
        if hint:
            assert hint in message.hint
    # Where: the view's dotted name and its route, every place once.
    apii = errors["apii"].msg
    for place in ("DrfNamed", "typo_view", "nested/typo/", "again/"):
        assert place in apii
    assert "test_checks_urls.Things" in errors["viewset_action_typo"].msg
    assert errors["dispatch_typo"].msg.count("DispatchTypo") == 1 and "as_view" not in errors["dispatch_typo"].msg
    assert "DEFAULT_THROTTLE_RATES" in errors["anon"].hint
    # The scope typo alone (no rate_limiter, so RateLimiterThrottle would just not limit): a warning.
    scope = [m for m in found.values() if m.id == "ratelimit_r4.W004"]
    assert len(scope) == 1 and "throttle_scope 'slwo'" in scope[0].msg
    assert "Did you mean 'slow'?" in scope[0].hint
    assert "acquirer" not in by_name and "api" not in by_name  # known names are never reported


def test_manage_py_check_fails_before_the_first_request(settings: Any) -> None:
    settings.ROOT_URLCONF = urlconf(path("typo/", typo_view))
    with pytest.raises(SystemCheckError) as info:
        call_command("check")
    output = str(info.value)
    assert "(ratelimit_r4.E024)" in output
    assert "uses ratelimiter 'apii'" in output and "Did you mean 'api'?" in output


def test_a_drf_scope_and_a_none_rate_are_known_names(settings: Any) -> None:
    settings.REST_FRAMEWORK = {"DEFAULT_THROTTLE_RATES": {"slwo": "5/min", "anon": None}}
    settings.ROOT_URLCONF = urlconf(path("scope/", DrfScopeTypo.as_view()), path("anon/", DrfAnonWithoutRate.as_view()))
    assert check_url_names() == []


def test_unimportable_views_and_odd_resolvers_do_not_crash_the_check(settings: Any) -> None:
    broken = types.ModuleType("names_check_broken_urls")  # no urlpatterns at all
    sys.modules["names_check_broken_urls"] = broken
    try:
        settings.ROOT_URLCONF = urlconf(
            path("typo/", typo_view),
            URLResolver(RoutePattern("missing/"), "names_check_module_that_does_not_exist"),  # imported lazily
            path("broken/", include("names_check_broken_urls")),
            OddPattern(),
        )
        found = check_url_names()
    finally:
        del sys.modules["names_check_broken_urls"]
    assert [m.id for m in found] == ["ratelimit_r4.E024"]
    settings.ROOT_URLCONF = "names_check_module_that_does_not_exist"
    assert check_url_names() == []  # Django's own URL checks report that


def test_the_test_project_and_a_clean_urlconf_pass(settings: Any) -> None:
    assert check_url_names() == []
    settings.ROOT_URLCONF = urlconf(path("fine/", all_known), path("ok/", ok))
    assert check_url_names() == []
    out = io.StringIO()
    call_command("check", stdout=out, stderr=out)
    assert "ratelimit_r4" not in out.getvalue()


def test_a_broken_setting_is_reported_once_not_as_every_name(settings: Any) -> None:
    settings.RATELIMIT_R4 = ["not", "a", "dict"]
    assert check_url_names() == []  # check_settings reports it (E001), not every name the views use
    settings.RATELIMIT_R4 = {"ratelimiters": ["not", "a", "dict"], "bulkheads": {"instances": {"acquirer": {}}}}
    settings.ROOT_URLCONF = urlconf(path("typo/", typo_view), path("bulkhead/", bulkhead_typo))
    assert [m.msg.split("uses ")[1][:20] for m in check_url_names()] == ["bulkhead 'acquier', "]


# ------------------------------------------------------------------------------------------- first use


def test_first_use_raises_improperly_configured_naming_the_closest_name(settings: Any) -> None:
    settings.ROOT_URLCONF = urlconf(path("typo/", typo_view), path("drf-named/", DrfNamed.as_view()))
    for url in ("/typo/", "/drf-named/"):
        with pytest.raises(ImproperlyConfigured, match=r"no ratelimiter named 'apii'.*Did you mean 'api'\?"):
            Client().get(url)


def test_a_fallback_never_hides_a_configuration_error(settings: Any) -> None:
    settings.ROOT_URLCONF = urlconf(path("typo/", typo_with_fallback), path("breaker/", breaker_typo))
    with pytest.raises(ImproperlyConfigured, match="Did you mean 'api'"):
        Client().get("/typo/")
    with pytest.raises(ImproperlyConfigured, match="Did you mean 'acquirer'"):
        Client().get("/breaker/")


def test_the_documented_output_is_what_check_prints(settings: Any) -> None:
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "configuration.md").read_text(encoding="utf-8")
    (shown,) = re.findall(r"```text\n(\?: \(ratelimit_r4\.E024\).*?)```", text, re.S)

    def orders(request: HttpRequest) -> HttpResponse:
        return HttpResponse("never")

    orders.__module__, orders.__qualname__ = "shop.views", "orders"
    settings.RATELIMIT_R4 = {"ratelimiters": {"instances": {"api": {}, "search": {}}}}
    settings.ROOT_URLCONF = urlconf(path("orders/", ratelimit("apii")(orders)))
    (message,) = check_url_names()
    assert f"?: ({message.id}) {message.msg}\n\tHINT: {message.hint}\n" == shown


# ------------------------------------------------------------------ permits above the limit (issue 8, item 7)


@ratelimit("api", permits=11)  # tests.settings: api allows 10 per second
def too_greedy(request: HttpRequest) -> HttpResponse:
    return HttpResponse("never")


@ratelimit("api", permits=10)
def whole_budget(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


class DrfTooGreedy(APIView):
    throttle_classes = [RateLimiterThrottle]
    rate_limiter = "slow"
    rate_limiter_permits = 20

    def get(self, request: Any) -> Response:
        return Response({})


class MethodTooGreedy(View):
    @method_decorator(resilient(ratelimiter=["api", "slow"], permits=12))
    def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("never")


def test_permits_above_a_limit_are_check_errors_naming_the_setting(settings: Any) -> None:
    settings.ROOT_URLCONF = urlconf(
        path("greedy/", too_greedy),
        path("greedy-again/", too_greedy),
        path("whole/", whole_budget),
        path("drf/", DrfTooGreedy.as_view()),
        path("method/", MethodTooGreedy.as_view()),
    )
    found = check_url_names()
    assert {m.id for m in found} == {"ratelimit_r4.E025"}
    assert all("Lower permits=" in m.hint for m in found)
    messages = sorted(m.msg for m in found)
    assert len(messages) == 4, messages  # greedy (both URLs in one message), drf, method: api and slow
    greedy = next(m for m in messages if "too_greedy" in m)
    assert "URL 'greedy/'" in greedy and "URL 'greedy-again/'" in greedy
    assert (
        "asks for 11 permits per request, but rate limiter 'api' allows only 10 per period "
        '(RATELIMIT_R4["ratelimiters"]["instances"]["api"]["limit_for_period"])' in greedy
    )
    assert any("DrfTooGreedy" in m and "20 permits" in m and "'slow'" in m for m in messages)
    assert sum("MethodTooGreedy" in m and "12 permits" in m for m in messages) == 2
    assert all("whole_budget" not in m for m in messages)  # the whole budget at once is fine
    with pytest.raises(SystemCheckError, match=r"ratelimit_r4\.E025"):
        call_command("check")


@ratelimit("5/m")
def rate_as_name(request: HttpRequest) -> HttpResponse:
    return HttpResponse("never")


def test_a_rate_written_as_a_limiter_name_gets_the_right_spelling(settings: Any) -> None:
    settings.ROOT_URLCONF = urlconf(path("rate/", rate_as_name))
    (message,) = check_url_names()
    assert message.id == "ratelimit_r4.E024"
    assert "'5/m' is a rate, not a name" in message.hint
    assert '["instances"]["api"] = {"rate": "5/m"}' in message.hint


@ratelimit("api", permits=3)
def three_at_once(request: HttpRequest) -> HttpResponse:
    return HttpResponse("never with a burst of 2")


def test_permits_above_a_gcra_burst_are_check_errors_naming_burst(settings: Any) -> None:
    import copy

    value = copy.deepcopy(settings.RATELIMIT_R4)
    value["ratelimiters"]["instances"]["api"].update({"algorithm": "gcra", "burst": 2})
    settings.RATELIMIT_R4 = value
    settings.ROOT_URLCONF = urlconf(path("three/", three_at_once))
    (message,) = check_url_names()
    assert message.id == "ratelimit_r4.E025"
    assert (
        "asks for 3 permits per request, but rate limiter 'api' allows only 2 at once "
        '(RATELIMIT_R4["ratelimiters"]["instances"]["api"]["burst"])' in message.msg
    )


# ---------------------------------------- a third-party backend in an all-or-nothing decision (issue 9, E035)

#: The methods and attributes of core.backend.KeyedBackend / RateLimiterBackend: all a third party's holder has.
KEYED_PROTOCOL = frozenset(
    {"remote", "rejection_quotas", "successful_calls", "failed_calls", "lossy_evictions", "decide", "adecide",
     "decide_quota", "adecide_quota", "state", "quota", "aquota", "drain", "reset", "set_clock", "purge", "keys",
     "live_keys"}
)
UNKEYED_PROTOCOL = frozenset(
    {"successful_calls", "failed_calls", "acquire", "state", "quota", "drain", "change_limit", "reset"}
)


class ProtocolOnlyKeyed:
    """A third party's in-process keyed store: the KeyedBackend protocol and nothing else."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        if name not in KEYED_PROTOCOL:
            raise AttributeError(name)
        return getattr(self._inner, name)

    def __len__(self) -> int:
        return len(self._inner)

    def __contains__(self, key: object) -> bool:
        return key in self._inner


class ProtocolOnlyBackend:
    """A third party's in-process unkeyed backend: the protocol, its acquire_many over backends of its own type."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        if name not in UNKEYED_PROTOCOL:
            raise AttributeError(name)
        return getattr(self._inner, name)

    def acquire_many(self, backends: Any, permits: int) -> Any:
        if not all(isinstance(b, ProtocolOnlyBackend) for b in backends):
            raise TypeError("cannot combine other backends with ProtocolOnlyBackends in one decision")
        from django_ratelimit_r4.backends.memory import acquire_many

        return acquire_many([b._inner for b in backends], permits)


class InProcessKeyedStore(MemoryStore):
    """BACKEND by dotted path, per process, keyed limits in its own store (unkeyed ones are the memory store's)."""

    def keyed_store(self, name: str, config: Any, **kwargs: Any) -> Any:
        return ProtocolOnlyKeyed(super().keyed_store(name, config, **kwargs))


class InProcessUnkeyedStore(MemoryStore):
    """BACKEND by dotted path, per process, unkeyed limits on its own backend (keyed ones are the memory store's)."""

    def backend_factory(self, on_error: str | None) -> Any:
        return lambda *args: ProtocolOnlyBackend(MemoryBackend(*args))


class SharedStore(MemoryStore):
    """A store saying its budgets are shared (per_process False): what its holders can do is known only once built."""

    per_process = False


def opaque_store(alias: str, location: str | None, options: Any) -> Any:
    """A function factory: nothing about its store is known before it is called."""
    return InProcessKeyedStore(alias, location, options)


def third_party_setting() -> dict[str, Any]:
    return {
        "backends": {
            "local_keyed": {"BACKEND": f"{__name__}.InProcessKeyedStore"},
            "local_unkeyed": {"BACKEND": f"{__name__}.InProcessUnkeyedStore"},
            "shared_tp": {"BACKEND": f"{__name__}.SharedStore"},
            "opaque": {"BACKEND": f"{__name__}.opaque_store"},
            "cluster": {"BACKEND": "redis", "LOCATION": "redis://127.0.0.1:6379/15"},  # never connected here
        },
        "ratelimiters": {
            "configs": {"default": {"limit_refresh_period": "1h"}},
            "instances": {
                "pool": {"limit_for_period": 5},
                "per_ip": {"limit_for_period": 5, "key": "ip"},
                "tp_ip": {"limit_for_period": 5, "backend": "local_keyed", "key": "ip"},
                "tp_ip2": {"limit_for_period": 5, "backend": "local_keyed", "key": "ip"},
                "tp_pool": {"limit_for_period": 5, "backend": "local_unkeyed"},
                "tp_pool2": {"limit_for_period": 5, "backend": "local_unkeyed"},
                "shared_ip": {"limit_for_period": 5, "backend": "shared_tp", "key": "ip"},
                "opaque_ip": {"limit_for_period": 5, "backend": "opaque", "key": "ip"},
                "redis_pool": {"limit_for_period": 5, "backend": "cluster"},
                "redis_ip": {"limit_for_period": 5, "backend": "cluster", "key": "ip"},
            },
        },
    }


#: (names one decorator decides, its key=, whether they cannot be decided together in this process). The
#: check must say so exactly when the first request raises TypeError.
IN_PROCESS_GROUPS: list[tuple[tuple[str, ...], str | None, bool]] = [
    (("pool", "tp_ip"), None, True),  # a keyed limit on a protocol-only store, with any other limit
    (("per_ip", "tp_ip"), None, True),
    (("tp_ip", "tp_ip2"), None, True),  # even two of the same store: the protocol has no all-or-nothing step
    (("tp_pool", "pool"), None, True),  # an unkeyed third-party backend with the memory backend's
    (("pool", "tp_pool"), None, True),
    (("tp_ip",), None, False),  # alone: decided by its store
    (("tp_pool", "per_ip"), None, False),  # keyed limits are peeked, the one unkeyed backend decides itself
    (("tp_pool", "tp_pool2"), None, False),  # acquire_many over backends of its own type
    (("tp_pool", "pool"), "ip", False),  # key= makes both keyed: tp_pool's keyed store is the memory store's
    (("pool", "per_ip"), None, False),
]


def _group_view(names: tuple[str, ...], key: str | None) -> Any:
    @ratelimit(list(names), key=key)
    def view(request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")

    view.__qualname__ = "group_" + "_".join(names) + (f"_key_{key}" if key else "")
    return view


@pytest.mark.parametrize(("names", "key", "fails"), IN_PROCESS_GROUPS, ids=lambda v: repr(v))
def test_a_decision_group_the_first_request_cannot_decide_is_a_check_error(
    settings: Any, names: tuple[str, ...], key: str | None, fails: bool
) -> None:
    """E035 exactly when the first request through the decorator raises TypeError (the check mirrors keyed.py)."""
    settings.RATELIMIT_R4 = third_party_setting()
    settings.ROOT_URLCONF = urlconf(path("group/", _group_view(names, key)))
    found = [m for m in check_url_names() if m.id == "ratelimit_r4.E035"]
    if fails:
        with pytest.raises(TypeError, match="cannot combine"):
            Client().get("/group/", REMOTE_ADDR="203.0.113.9")
        assert found  # one message per limit that cannot join (two for ("tp_ip", "tp_ip2"))
        for message in found:
            assert "URL 'group/'" in message.msg and repr(list(names)) in message.msg
            assert "the first request would fail with TypeError" in message.msg
            assert "in its own @ratelimit" in message.hint and "memory or redis backend" in message.hint
    else:
        assert found == []
        assert Client().get("/group/", REMOTE_ADDR="203.0.113.9").status_code == 200


def test_e035_names_the_view_the_limits_the_backend_and_fails_manage_py_check(settings: Any) -> None:
    settings.RATELIMIT_R4 = third_party_setting()
    settings.ROOT_URLCONF = urlconf(path("orders/", _group_view(("pool", "tp_ip"), None)))
    (message,) = check_url_names()
    assert message.id == "ratelimit_r4.E035"
    assert message.msg == (
        "tests.test_checks_urls.group_pool_tp_ip (URL 'orders/'): decides rate limiters ['pool', 'tp_ip'] "
        "all-or-nothing, but 'tp_ip' is keyed on backend 'local_keyed' (tests.test_checks_urls.InProcessKeyedStore, "
        "a third-party store kept in each process), whose keyed store has only the KeyedBackend protocol: it "
        "decides its limits one at a time; the first request would fail with TypeError"
    )
    assert message.hint == (
        "Decide 'tp_ip' in its own @ratelimit (stacked with one for the others), or give it a memory or redis "
        'backend (RATELIMIT_R4["ratelimiters"]["instances"]["tp_ip"]["backend"]).'
    )
    with pytest.raises(SystemCheckError, match=r"ratelimit_r4\.E035"):
        call_command("check")


class DrfThirdPartyGroup(APIView):
    throttle_classes = [RateLimiterThrottle]
    rate_limiter = ["pool", "tp_ip"]

    def get(self, request: Any) -> Response:
        return Response({})


class MethodThirdPartyGroup(View):
    @method_decorator(ratelimit(["tp_pool", "pool"]))
    def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("never")


@ratelimit("pool")
@ratelimit("tp_ip")
def stacked_alone(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


def test_drf_throttles_and_class_based_views_are_checked_and_stacked_decorators_are_not_a_group(
    settings: Any,
) -> None:
    settings.RATELIMIT_R4 = third_party_setting()
    settings.ROOT_URLCONF = urlconf(
        path("drf/", DrfThirdPartyGroup.as_view()),
        path("method/", MethodThirdPartyGroup.as_view()),
        path("stacked/", stacked_alone),
    )
    found = {m.msg: m for m in check_url_names()}
    assert {m.id for m in found.values()} == {"ratelimit_r4.E035"}
    assert len(found) == 2, list(found)
    drf = next(m for m in found if "DrfThirdPartyGroup (URL 'drf/')" in m)
    assert "'tp_ip' is keyed on backend 'local_keyed'" in drf
    method = next(m for m in found if "MethodThirdPartyGroup (URL 'method/')" in m)
    assert "'tp_pool' is unkeyed on backend 'local_unkeyed'" in method and "'pool'" in method
    with pytest.raises(TypeError, match="cannot combine"):
        Client().get("/drf/", REMOTE_ADDR="203.0.113.9")
    assert [Client().get("/stacked/", REMOTE_ADDR="203.0.113.9").status_code for _ in range(2)] == [200, 200]


@pytest.mark.parametrize(
    "names",
    [
        ("pool", "redis_pool"),  # memory and Redis: the mixed path decides them
        ("per_ip", "redis_ip", "pool"),
        ("shared_ip", "pool"),  # a store saying its state is shared: its holders are known only once built
        ("opaque_ip", "pool"),  # a function factory: nothing is known before it is called (documented)
    ],
)
def test_combinations_the_check_cannot_refuse_from_settings_stay_silent(settings: Any, names: tuple[str, ...]) -> None:
    settings.RATELIMIT_R4 = third_party_setting()
    settings.ROOT_URLCONF = urlconf(path("group/", _group_view(names, None)))
    assert check_url_names() == []


def test_an_unkeyed_third_party_backend_with_a_redis_limit_is_a_check_error(settings: Any) -> None:
    """When Redis refuses, the mixed path gives the in-process take back with give_back, which the protocol has not:
    the first request raises TypeError before taking anything (tests/backends/test_backends_config.py)."""
    settings.RATELIMIT_R4 = third_party_setting()
    settings.ROOT_URLCONF = urlconf(path("group/", _group_view(("tp_pool", "redis_ip"), None)))
    (message,) = check_url_names()
    assert message.id == "ratelimit_r4.E035"
    assert (
        "'tp_pool' is unkeyed on backend 'local_unkeyed' (tests.test_checks_urls.InProcessUnkeyedStore, a "
        "third-party store kept in each process), whose backend cannot give a permit back (the protocol has no "
        "give_back), which a decision with 'redis_ip' (backend 'cluster', Redis) needs when Redis refuses"
    ) in message.msg


# ---------------------------------------- Redis limits on two connections in one decision (E035)


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    """A key prefix of this test only (as tests/backends/conftest.py's ``prefix``): its keys are deleted and this
    process's Redis connections closed afterwards."""
    import redis

    from django_ratelimit_r4.backends import redis as rb

    value = f"r4test:{uuid.uuid4().hex[:12]}"
    yield value
    rb.close_connections()
    client = redis.Redis.from_url(redis_url)
    try:
        keys = list(client.scan_iter(match=value + ":*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def two_connections_setting(url: str, prefix: str) -> dict[str, Any]:
    """Redis backends on the test Redis that share one connection or not, as ``backends.redis.connection`` decides:
    one per LOCATION as written and OPTIONS but key_prefix (patient timeouts: tests/backends/patient.py)."""
    patient = {"socket_timeout": "5s", "socket_connect_timeout": "5s", "key_prefix": prefix}
    query = "&" if "?" in url else "?"
    return {
        "backends": {
            "main": {"BACKEND": "redis", "LOCATION": url, "OPTIONS": patient},
            # the same connection: the same URL and the same options once parsed ("5000ms" and 5 s are 5.0 s)
            "twin": {"BACKEND": "redis", "LOCATION": url, "OPTIONS": {
                "socket_timeout": "5000ms", "socket_connect_timeout": timedelta(seconds=5), "key_prefix": prefix}},
            # key_prefix is the store's, not the connection's: still main's connection
            "prefixed": {"BACKEND": "redis", "LOCATION": url, "OPTIONS": {**patient, "key_prefix": f"{prefix}:b"}},
            # the same server, another pool: another connection
            "pooled": {"BACKEND": "redis", "LOCATION": url, "OPTIONS": {**patient, "max_connections": 4}},
            # an option written out with its default value is still an option of the connection's identity
            "standalone": {"BACKEND": "redis", "LOCATION": url, "OPTIONS": {**patient, "cluster": False}},
            # the URL as written (its query string sets pool options too): another connection
            "queried": {"BACKEND": "redis", "LOCATION": f"{url}{query}health_check_interval=30", "OPTIONS": patient},
        },
        "ratelimiters": {
            "configs": {"default": {"limit_refresh_period": "1h"}},
            "instances": {
                "pool": {"limit_for_period": 5},  # the default backend: memory
                "r_pool": {"limit_for_period": 5, "backend": "main"},
                "r_ip": {"limit_for_period": 5, "backend": "main", "key": "ip"},
                "twin_pool": {"limit_for_period": 5, "backend": "twin"},
                "prefixed_ip": {"limit_for_period": 5, "backend": "prefixed", "key": "ip"},
                "pooled_pool": {"limit_for_period": 5, "backend": "pooled"},
                "pooled_ip": {"limit_for_period": 5, "backend": "pooled", "key": "ip", "algorithm": "gcra"},
                "standalone_pool": {"limit_for_period": 5, "backend": "standalone"},
                "queried_ip": {"limit_for_period": 5, "backend": "queried", "key": "ip", "algorithm": "sliding_window"},
            },
        },
    }


#: (names one decorator decides, its key=, whether its Redis limits are on two connections). The check must say
#: so exactly when the first request raises TypeError.
REDIS_GROUPS: list[tuple[tuple[str, ...], str | None, bool]] = [
    (("r_pool", "twin_pool"), None, False),  # two aliases, one connection
    (("r_pool", "r_ip", "prefixed_ip"), None, False),  # another key_prefix on the same connection
    (("pool", "r_ip", "twin_pool"), None, False),  # memory with one connection: the mixed path
    (("r_pool", "pooled_pool"), None, True),  # the same LOCATION, another max_connections
    (("r_ip", "pooled_ip"), None, True),
    (("r_pool", "standalone_pool"), None, True),  # "cluster": False written out
    (("r_ip", "queried_ip"), None, True),  # the same server, the URL written otherwise
    (("pool", "r_pool", "pooled_ip"), None, True),  # memory does not help: the Redis part is still one script
    (("twin_pool", "prefixed_ip", "queried_ip"), None, True),
    (("r_pool", "pooled_pool"), "ip", True),  # key= makes both keyed: the keyed stores share their backend's
    (("r_pool", "twin_pool"), "ip", False),
]


@pytest.mark.parametrize(("names", "key", "fails"), REDIS_GROUPS, ids=lambda v: repr(v))
def test_a_decision_group_on_two_redis_connections_is_a_check_error(
    settings: Any, redis_url: str, redis_prefix: str, names: tuple[str, ...], key: str | None, fails: bool
) -> None:
    """E035 exactly when the first request through the decorator raises TypeError (keyed._remote_decider: one
    all-or-nothing script per connection)."""
    settings.RATELIMIT_R4 = two_connections_setting(redis_url, redis_prefix)
    settings.ROOT_URLCONF = urlconf(path("group/", _group_view(names, key)))
    found = [m for m in check_url_names() if m.id == "ratelimit_r4.E035"]
    if fails:
        with pytest.raises(TypeError, match="different places"):
            Client().get("/group/", REMOTE_ADDR="203.0.113.9")
        (message,) = found
        assert "URL 'group/'" in message.msg and repr(list(names)) in message.msg
        assert "different Redis connections" in message.msg
        assert "the first request would fail with TypeError" in message.msg
        assert "one redis backend" in message.hint and "a @ratelimit of its own" in message.hint
    else:
        assert found == []
        assert [Client().get("/group/", REMOTE_ADDR="203.0.113.9").status_code for _ in range(2)] == [200, 200]


def test_e035_for_two_redis_connections_names_them_redacted_without_connecting(settings: Any) -> None:
    """The message names the view, the limits, the backends and their URLs (no password) and what differs; the
    check decides from the setting alone: no connection is made."""
    from django_ratelimit_r4.backends import redis as rb

    settings.RATELIMIT_R4 = {
        "backends": {
            "orders": {"BACKEND": "redis", "LOCATION": "redis://:s3cret@10.0.0.7:6379/0"},
            "orders_fast": {
                "BACKEND": "redis",
                "LOCATION": "redis://:s3cret@10.0.0.7:6379/0",
                "OPTIONS": {"socket_timeout": "50ms", "key_prefix": "fast"},
            },
            "users": {"BACKEND": "redis", "LOCATION": "redis://u:pw@10.0.0.8:6379/1", "OPTIONS": {"key_prefix": "u"}},
        },
        "ratelimiters": {
            "configs": {"default": {"limit_refresh_period": "1m"}},
            "instances": {
                "burst": {"limit_for_period": 5, "backend": "orders"},
                "per_ip": {"limit_for_period": 5, "backend": "orders_fast", "key": "ip"},
                "per_user": {"limit_for_period": 5, "backend": "users", "key": "ip"},
            },
        },
    }
    settings.ROOT_URLCONF = urlconf(
        path("orders/", _group_view(("burst", "per_ip"), None)),
        path("users/", _group_view(("burst", "per_user"), None)),
        path("drf/", DrfTwoConnections.as_view()),
    )
    before = dict(rb._connections)
    messages = {m.msg.split(":", 1)[0]: m for m in check_url_names()}
    assert rb._connections == before  # nothing connected (nor built)
    assert {m.id for m in messages.values()} == {"ratelimit_r4.E035"}
    assert all("s3cret" not in m.msg + m.hint and "pw@" not in m.msg + m.hint for m in messages.values())
    orders = messages["tests.test_checks_urls.group_burst_per_ip (URL 'orders/')"]
    assert orders.msg == (
        "tests.test_checks_urls.group_burst_per_ip (URL 'orders/'): decides rate limiters ['burst', 'per_ip'] "
        "all-or-nothing, but they are on 2 different Redis connections, which one script cannot reach together: "
        "'burst' (backend 'orders') at redis://***@10.0.0.7:6379/0 (no socket_timeout); "
        "'per_ip' (backend 'orders_fast') at redis://***@10.0.0.7:6379/0 (socket_timeout=0.05); "
        "the first request would fail with TypeError"
    )
    assert orders.hint == (
        "Put them on one redis backend, or on backends with the same LOCATION and the same OPTIONS but key_prefix "
        "(one connection): "
        'RATELIMIT_R4["ratelimiters"]["instances"]["per_ip"]["backend"]; or decide the limits of each connection '
        "in a @ratelimit of its own (stacked: each decorator decides on its own)."
    )
    users = messages["tests.test_checks_urls.group_burst_per_user (URL 'users/')"]
    assert (
        "'burst' (backend 'orders') at redis://***@10.0.0.7:6379/0; "
        "'per_user' (backend 'users') at redis://***@10.0.0.8:6379/1; "
    ) in users.msg
    assert "DrfTwoConnections (URL 'drf/')" in next(iter(k for k in messages if "drf/" in k))
    with pytest.raises(SystemCheckError, match=r"ratelimit_r4\.E035"):
        call_command("check")


class DrfTwoConnections(APIView):
    throttle_classes = [RateLimiterThrottle]
    rate_limiter = ["per_ip", "per_user"]

    def get(self, request: Any) -> Response:
        return Response({})


# ----------------------------------------------- a DRF view's throttle arguments that fail every request (E036)


class DrfZeroPermits(APIView):
    throttle_classes = [RateLimiterThrottle]
    rate_limiter = "api"
    rate_limiter_permits = 0

    def get(self, request: Any) -> Response:
        return Response({})


class DrfBadMethods(APIView):
    throttle_classes = [RateLimiterThrottle]
    rate_limiter = "api"
    rate_limiter_methods = ["GET", "NOT A METHOD"]

    def get(self, request: Any) -> Response:
        return Response({})


class DrfNamedTwice(APIView):
    throttle_classes = [RateLimiterThrottle]
    rate_limiter = ["api", "api"]

    def get(self, request: Any) -> Response:
        return Response({})


class MistypedKeyThrottle(AnonRateThrottle):
    scope = "api"
    key = "ipp"


class UnimportableKeyThrottle(AnonRateThrottle):
    scope = "api"
    key = "tests.test_checks_urls.no_such_key_function"


class DrfBadDropInKey(APIView):
    throttle_classes = [MistypedKeyThrottle]

    def get(self, request: Any) -> Response:
        return Response({})


class DrfUnimportableKey(APIView):
    throttle_classes = [UnimportableKeyThrottle]

    def get(self, request: Any) -> Response:
        return Response({})


class ListKeyThrottle(AnonRateThrottle):
    scope = "api"
    key = ["session"]  # type: ignore[assignment]  # unhashable: the W007 / W009 walk must not crash on it


class DrfListKey(APIView):
    throttle_classes = [ListKeyThrottle]

    def get(self, request: Any) -> Response:
        return Response({})


@pytest.mark.parametrize(
    ("view", "fragment"),
    [
        (DrfZeroPermits, "permits must be an int >= 1, got 0"),
        (DrfBadMethods, "'NOT A METHOD' is not an HTTP method"),
        (DrfNamedTwice, "a rate limiter is named twice"),
        (DrfBadDropInKey, "unknown key 'ipp'"),
        (DrfUnimportableKey, "cannot import key function 'tests.test_checks_urls.no_such_key_function'"),
        (DrfListKey, "key must be a string or a callable, got list"),  # was: unhashable type: 'list'
    ],
)
def test_drf_throttle_arguments_that_fail_every_request_are_check_errors(
    settings: Any, r4_clock: Any, view: type, fragment: str
) -> None:
    # They passed manage.py check, and every request to the view raised ValueError or TypeError: a 500 each time.
    settings.ROOT_URLCONF = urlconf(path("v/", view.as_view()))
    with pytest.raises((TypeError, ValueError), match=re.escape(fragment)):
        Client(raise_request_exception=True).get("/v/")
    found = [m for m in check_url_names() if m.id == "ratelimit_r4.E036"]
    assert len(found) == 1, [m.msg for m in check_url_names()]
    assert fragment in found[0].msg and f"{view.__name__} (URL 'v/')" in found[0].msg
    assert "every request to the view would fail" in found[0].msg
    assert found[0].hint
    with pytest.raises(SystemCheckError, match=r"ratelimit_r4\.E036"):
        call_command("check")


def test_an_unhashable_drop_in_key_is_e036_and_does_not_crash_the_key_walk(settings: Any) -> None:
    # W007's and W009's walk reads every drop-in throttle's key: a list (a TypeError at every request) is E036 only.
    settings.MIDDLEWARE = []
    settings.ROOT_URLCONF = urlconf(path("v/", DrfListKey.as_view()))
    found = check_url_names()
    assert [m.id for m in found] == ["ratelimit_r4.E036"], [m.msg for m in found]
    assert "DrfListKey (URL 'v/')" in found[0].msg


def test_valid_drf_throttle_arguments_raise_no_e036(settings: Any) -> None:
    settings.ROOT_URLCONF = everything()
    assert not [m for m in check_url_names() if m.id == "ratelimit_r4.E036"]


@ratelimit("api", key="tests.test_checks_urls.no_such_key_function")
def unimportable_key_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse("never")


@ratelimit("api", key="tests.test_checks_urls.tenant_key")
def importable_key_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


def tenant_key(request: HttpRequest) -> str | None:
    return request.GET.get("tenant")


def test_a_decorators_unimportable_dotted_key_is_a_check_error(settings: Any, r4_clock: Any) -> None:
    # The path is imported at the first request (the view's own module may define it): it raised ValueError at
    # every request, a 500 each time, and passed manage.py check.
    settings.ROOT_URLCONF = urlconf(path("v/", unimportable_key_view), path("fine/", importable_key_view))
    with pytest.raises(ValueError, match="cannot import key function"):
        Client(raise_request_exception=True).get("/v/")
    assert Client().get("/fine/").status_code == 200
    found = [m for m in check_url_names() if m.id == "ratelimit_r4.E036"]
    assert len(found) == 1, [m.msg for m in check_url_names()]
    assert "unimportable_key_view (URL 'v/')" in found[0].msg and "fine/" not in found[0].msg
    assert "cannot import key function 'tests.test_checks_urls.no_such_key_function'" in found[0].msg


# ---------------------------------------- a limit keyed by the user without AuthenticationMiddleware (W007)

SESSIONS_ONLY = ["django.contrib.sessions.middleware.SessionMiddleware"]


class FakeUserMiddleware(AuthenticationMiddleware):
    """A subclass of AuthenticationMiddleware (what the check accepts) that signs every request in as user 7."""

    def process_request(self, request: HttpRequest) -> None:
        request.user = types.SimpleNamespace(pk=7, is_authenticated=True)  # type: ignore[assignment]


def user_keyed_setting(settings: Any) -> dict[str, Any]:
    value = copy.deepcopy(settings.RATELIMIT_R4)
    value["ratelimiters"]["instances"]["per_user"] = {"limit_for_period": 2, "key": "user"}
    value["ratelimiters"]["instances"]["per_user_or_ip"] = {"limit_for_period": 2, "key": "user_or_ip"}
    return value


@ratelimit("burst", key="user")
def user_keyed(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit("per_user")
async def instance_user_keyed(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@resilient(ratelimiter=["per_user_or_ip", "burst3"], bulkhead="acquirer")
def instance_user_or_ip_keyed(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit("per_user", key="ip")
def user_instance_keyed_by_ip(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


class ViewUserKeyed(View):
    @method_decorator(ratelimit("burst", key="user"))
    def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")


class DrfUserKeyed(APIView):  # type: ignore[misc]
    """DRF authenticates its own Request (its authentication classes): not the middleware's business."""

    throttle_classes = [RateLimiterThrottle]
    rate_limiter = "per_user"

    @method_decorator(ratelimit("burst", key="user"))
    def get(self, request: Any) -> Response:
        return Response({})


@method_decorator(ratelimit("per_user"), name="dispatch")
class DrfDispatchUserKeyed(APIView):  # type: ignore[misc]
    """dispatch() gets Django's HttpRequest, before DRF wraps it: request.user is the middleware's."""

    def get(self, request: Any) -> Response:
        return Response({})


def user_keyed_urls() -> types.ModuleType:
    return urlconf(
        path("user/", user_keyed),
        path("user-again/", user_keyed),
        path("instance/", instance_user_keyed),
        path("user-or-ip/", instance_user_or_ip_keyed),
        path("by-ip/", user_instance_keyed_by_ip),
        path("view/", ViewUserKeyed.as_view()),
        path("drf/", DrfUserKeyed.as_view()),
        path("drf-dispatch/", DrfDispatchUserKeyed.as_view()),
        path("ok/", ok),
    )


def test_a_user_key_without_authentication_middleware_limits_nothing_and_is_a_check_warning(
    settings: Any, r4_clock: Any
) -> None:
    settings.RATELIMIT_R4 = user_keyed_setting(settings)
    settings.MIDDLEWARE = SESSIONS_ONLY
    settings.ROOT_URLCONF = user_keyed_urls()
    # What the warning is about: no request.user, so the "user" key exempts every request, silently.
    assert [Client().get("/user/").status_code for _ in range(5)] == [200] * 5
    assert [Client().get("/instance/").status_code for _ in range(5)] == [200] * 5
    found = [m for m in check_url_names() if m.id == "ratelimit_r4.W007"]
    assert all(isinstance(m, CheckWarning) for m in found)
    assert len(found) == 3, [m.msg for m in found]
    user = next(m for m in found if "key='user' of the decorator" in m.msg)
    assert user.msg.startswith(
        "tests.test_checks_urls.user_keyed (URL 'user/'), tests.test_checks_urls.user_keyed (URL 'user-again/'), "
        "tests.test_checks_urls.ViewUserKeyed (URL 'view/'): rate limiter 'burst' is keyed by the user (key='user' of "
        "the decorator), but django.contrib.auth.middleware.AuthenticationMiddleware is not in MIDDLEWARE"
    ), user.msg
    assert "no request.user: every request is exempt from this limit (not limited)" in user.msg
    assert user.hint == (
        "Add 'django.contrib.auth.middleware.AuthenticationMiddleware' to MIDDLEWARE (after SessionMiddleware), "
        "or key the limit by something the request has ('ip'); if a middleware of your own sets request.user, "
        "silence ratelimit_r4.W007."
    )
    instance = next(m for m in found if '["per_user"]["key"]' in m.msg)
    assert instance.msg.startswith(
        "tests.test_checks_urls.instance_user_keyed (URL 'instance/'), tests.test_checks_urls.DrfDispatchUserKeyed "
        "(URL 'drf-dispatch/'): rate limiter 'per_user' is keyed by the user "
        '(RATELIMIT_R4["ratelimiters"]["instances"]["per_user"]["key"] = \'user\')'
    ), instance.msg
    either = next(m for m in found if "per_user_or_ip" in m.msg)
    assert "instance_user_or_ip_keyed (URL 'user-or-ip/')" in either.msg
    assert "every request is keyed by its client IP, never per user: users behind one address share a budget" in (
        either.msg
    )
    assert not any("burst3" in m.msg or "by-ip" in m.msg or "'drf/'" in m.msg for m in found), [m.msg for m in found]


def test_authentication_middleware_or_a_subclass_keys_by_the_user_and_silences_w007(
    settings: Any, r4_clock: Any
) -> None:
    settings.RATELIMIT_R4 = user_keyed_setting(settings)
    settings.ROOT_URLCONF = user_keyed_urls()
    assert not [m for m in check_url_names() if m.id == "ratelimit_r4.W007"]  # the tests' settings have it
    settings.MIDDLEWARE = [*SESSIONS_ONLY, f"{__name__}.FakeUserMiddleware"]
    assert not [m for m in check_url_names() if m.id == "ratelimit_r4.W007"]
    assert [Client().get("/user/").status_code for _ in range(3)] == [200, 200, 429]  # user 7's budget


def test_without_user_keys_a_missing_authentication_middleware_is_not_a_warning(settings: Any) -> None:
    settings.MIDDLEWARE = []
    settings.ROOT_URLCONF = urlconf(path("by-ip/", user_instance_keyed_by_ip), path("drf/", DrfUserKeyed.as_view()))
    settings.RATELIMIT_R4 = user_keyed_setting(settings)
    assert check_url_names() == []


# ---------------------------------------- a limit keyed by the session without SessionMiddleware (W009)


class FakeSessionMiddleware(SessionMiddleware):
    """A subclass of SessionMiddleware (what the check accepts)."""


def session_keyed_setting(settings: Any) -> dict[str, Any]:
    value = copy.deepcopy(settings.RATELIMIT_R4)
    value["ratelimiters"]["instances"]["per_session"] = {"limit_for_period": 2, "key": "session"}
    return value


@ratelimit("burst", key="session")
def session_keyed(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit("per_session")
async def instance_session_keyed(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit("per_session", key="ip")
def session_instance_keyed_by_ip(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


class ViewSessionKeyed(View):
    @method_decorator(ratelimit("burst", key="session"))
    def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")


class DrfSessionThrottled(APIView):  # type: ignore[misc]
    """DRF's Request reads the HttpRequest's session: a throttle keyed by it is W009's business."""

    throttle_classes = [RateLimiterThrottle]
    rate_limiter = "per_session"

    def get(self, request: Any) -> Response:
        return Response({})


class SessionThrottle(UserRateThrottle):
    scope = "burst3"
    key = "session"


class DrfHandlerSessionKeyed(APIView):  # type: ignore[misc]
    """A drop-in throttle class's key= and a decorator on a DRF handler (DRF's Request): both W009's business."""

    throttle_classes = [SessionThrottle]

    @method_decorator(ratelimit("burst", key="session"))
    def get(self, request: Any) -> Response:
        return Response({})


def session_keyed_urls() -> types.ModuleType:
    return urlconf(
        path("session/", session_keyed),
        path("instance/", instance_session_keyed),
        path("by-ip/", session_instance_keyed_by_ip),
        path("view/", ViewSessionKeyed.as_view()),
        path("drf/", DrfSessionThrottled.as_view()),
        path("drf-handler/", DrfHandlerSessionKeyed.as_view()),
        path("ok/", ok),
    )


def two_sessions(settings: Any, address: str) -> tuple[Client, Client]:
    """Two clients from ``address``, each with a session the store knows (as after a login or a cart)."""
    settings.SESSION_ENGINE = "django.contrib.sessions.backends.cache"
    clients = []
    for n in range(2):
        store = SessionStore()
        store["cart"] = [n]
        store.save()
        client = Client(REMOTE_ADDR=address)
        client.cookies[settings.SESSION_COOKIE_NAME] = store.session_key
        clients.append(client)
    return clients[0], clients[1]


def test_a_session_key_without_session_middleware_keys_every_request_by_ip_and_is_a_check_warning(
    settings: Any, r4_clock: Any
) -> None:
    settings.RATELIMIT_R4 = session_keyed_setting(settings)
    settings.MIDDLEWARE = []
    settings.ROOT_URLCONF = session_keyed_urls()
    # What the warning is about: no request.session, so two known sessions from one address share its budget.
    for n, url in enumerate(("/session/", "/instance/", "/view/", "/drf/", "/drf-handler/")):
        alice, bob = two_sessions(settings, f"192.0.2.{n}")
        assert [alice.get(url).status_code for _ in range(2)] == [200, 200], url
        assert bob.get(url).status_code == 429, url
    found = [m for m in check_url_names() if m.id == "ratelimit_r4.W009"]
    assert all(isinstance(m, CheckWarning) for m in found)
    assert len(found) == 3, [m.msg for m in found]
    decorator = next(m for m in found if "key='session' of the decorator" in m.msg)
    assert decorator.msg == (
        "tests.test_checks_urls.session_keyed (URL 'session/'), tests.test_checks_urls.ViewSessionKeyed (URL 'view/'), "
        "tests.test_checks_urls.DrfHandlerSessionKeyed (URL 'drf-handler/'): rate limiter 'burst' is keyed by the "
        "session, else the client IP (key='session' of the decorator), but "
        "django.contrib.sessions.middleware.SessionMiddleware is not in MIDDLEWARE, so requests have no "
        "request.session: every request is keyed by its client IP, never per session: clients behind one address "
        "share a budget"
    ), decorator.msg
    assert decorator.hint == (
        "Add 'django.contrib.sessions.middleware.SessionMiddleware' to MIDDLEWARE (before AuthenticationMiddleware), "
        "or key the limit by 'ip' if a per-address budget is what you want; if a middleware of your own sets "
        "request.session, silence ratelimit_r4.W009."
    )
    instance = next(m for m in found if '["per_session"]["key"]' in m.msg)
    assert instance.msg.startswith(
        "tests.test_checks_urls.instance_session_keyed (URL 'instance/'), tests.test_checks_urls.DrfSessionThrottled "
        "(URL 'drf/'): rate limiter 'per_session' is keyed by the session, else the client IP "
        '(RATELIMIT_R4["ratelimiters"]["instances"]["per_session"]["key"] = \'session\')'
    ), instance.msg
    throttle = next(m for m in found if "burst3" in m.msg)
    assert throttle.msg.startswith(
        "tests.test_checks_urls.DrfHandlerSessionKeyed (URL 'drf-handler/'): rate limiter 'burst3' is keyed by the "
        "session, else the client IP (key='session' of throttle class tests.test_checks_urls.SessionThrottle)"
    ), throttle.msg
    assert not any("by-ip" in m.msg for m in found), [m.msg for m in found]
    # Not W007's business: no limit here reads request.user on Django's HttpRequest.
    assert not [m for m in check_url_names() if m.id == "ratelimit_r4.W007"]


def test_session_middleware_or_a_subclass_keys_by_the_session_and_silences_w009(
    settings: Any, r4_clock: Any
) -> None:
    settings.RATELIMIT_R4 = session_keyed_setting(settings)
    settings.ROOT_URLCONF = session_keyed_urls()
    assert not [m for m in check_url_names() if m.id == "ratelimit_r4.W009"]  # the tests' settings have it
    settings.MIDDLEWARE = [f"{__name__}.FakeSessionMiddleware"]
    assert not [m for m in check_url_names() if m.id == "ratelimit_r4.W009"]
    for n, url in enumerate(("/session/", "/instance/", "/view/", "/drf/", "/drf-handler/")):
        alice, bob = two_sessions(settings, f"192.0.2.{n}")
        assert [alice.get(url).status_code for _ in range(3)] == [200, 200, 429], url  # alice's session's budget
        assert [bob.get(url).status_code for _ in range(2)] == [200, 200], url  # bob's own, at the same address
        assert Client(REMOTE_ADDR=f"192.0.2.{n}").get(url).status_code == 200, url  # no session: the address's


def test_without_session_keys_a_missing_session_middleware_is_not_a_warning(settings: Any) -> None:
    settings.MIDDLEWARE = []
    settings.ROOT_URLCONF = urlconf(path("by-ip/", session_instance_keyed_by_ip), path("ok/", ok))
    settings.RATELIMIT_R4 = session_keyed_setting(settings)
    assert check_url_names() == []
