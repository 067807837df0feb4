"""429/503 responses: status, Retry-After, problem+json vs text, caching, custom builders."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from django.http import HttpResponse
from django.test import RequestFactory

from django_ratelimit_r4.core.exceptions import (
    BulkheadFull,
    CallNotPermitted,
    MaxRetriesExceeded,
    RequestNotPermitted,
)
from django_ratelimit_r4.responses import (
    PROBLEM_QUOTA_EXCEEDED,
    PROBLEM_TEMPORARY_REDUCED_CAPACITY,
    accepts_json,
    resolve_response_builder,
    response_for_exception,
)

rf = RequestFactory()
S = 1_000_000_000


def rejected(wait_ns: int = 0, name: str = "api") -> RequestNotPermitted:
    return RequestNotPermitted(SimpleNamespace(name=name), wait_ns=wait_ns)


def broken(wait_ns: int) -> CallNotPermitted:
    return CallNotPermitted(SimpleNamespace(name="acquirer"), SimpleNamespace(name="OPEN"), wait_ns=wait_ns)


def full() -> BulkheadFull:
    return BulkheadFull(SimpleNamespace(name="acquirer"))


def json_request():
    return rf.get("/", HTTP_ACCEPT="application/json")


def text_request():
    return rf.get("/", HTTP_ACCEPT="text/plain")


def custom_builder(request, exc, *, status, retry_after):
    """Referenced by dotted path in the tests."""
    return HttpResponse(f"custom {exc.name} {retry_after}", status=status)


class TestRateLimited:
    @pytest.mark.parametrize(
        ("wait_ns", "retry_after"),
        [(0, "1"), (1, "1"), (S - 1, "1"), (S, "1"), (S + 1, "2"), (50 * S, "50"), (49 * S + 1, "50")],
    )
    def test_429_with_retry_after_rounded_up(self, wait_ns, retry_after):
        response = response_for_exception(json_request(), rejected(wait_ns))
        assert response.status_code == 429
        assert response["Retry-After"] == retry_after

    def test_problem_json_body(self):
        response = response_for_exception(json_request(), rejected(10 * S))
        assert response["Content-Type"] == "application/problem+json"
        assert json.loads(response.content) == {
            "type": PROBLEM_QUOTA_EXCEEDED,
            "title": "Quota Exceeded",
            "status": 429,
            "detail": "RateLimiter 'api' does not permit further calls; retry after 10 seconds.",
            "name": "api",
            "retry_after": 10,
            "violated-policies": ["api"],
        }

    def test_violated_policies_from_exception(self):
        exc = rejected(S)
        exc.violated_policies = ["burst", "sustained"]
        body = json.loads(response_for_exception(json_request(), exc).content)
        assert body["violated-policies"] == ["burst", "sustained"]

    def test_not_cacheable(self):
        response = response_for_exception(json_request(), rejected(S))
        assert response["Cache-Control"] == "no-store"
        assert response["Vary"] == "Accept"

    def test_plain_text(self):
        response = response_for_exception(text_request(), rejected(S))
        assert response["Content-Type"] == "text/plain; charset=utf-8"
        assert response.content == b"RateLimiter 'api' does not permit further calls; retry after 1 second.\n"
        assert response["Cache-Control"] == "no-store"


class TestServiceUnavailable:
    def test_open_breaker_reports_remaining_open_time(self):
        response = response_for_exception(json_request(), broken(int(2.4 * S)))
        assert response.status_code == 503
        assert response["Retry-After"] == "3"
        body = json.loads(response.content)
        assert body["type"] == "about:blank"
        assert body["title"] == "Service Unavailable"
        assert body["status"] == 503
        assert body["name"] == "acquirer"
        assert body["retry_after"] == 3
        assert "violated-policies" not in body
        assert "OPEN" in body["detail"]

    def test_forced_open_without_wait_says_1(self):
        assert response_for_exception(json_request(), broken(0))["Retry-After"] == "1"

    def test_bulkhead_default_retry_after(self):
        response = response_for_exception(json_request(), full())
        assert response.status_code == 503
        assert response["Retry-After"] == "1"
        body = json.loads(response.content)
        assert body["type"] == PROBLEM_TEMPORARY_REDUCED_CAPACITY
        assert body["violated-policies"] == ["acquirer"]

    def test_bulkhead_configured_retry_after(self):
        response = response_for_exception(json_request(), full(), bulkhead_retry_after_ns=int(4.5 * S))
        assert response["Retry-After"] == "5"
        response = response_for_exception(json_request(), full(), bulkhead_retry_after_ns=1e9)
        assert response["Retry-After"] == "1"

    def test_503_not_cacheable(self):
        assert response_for_exception(text_request(), full())["Cache-Control"] == "no-store"

    def test_other_exceptions_refused(self):
        with pytest.raises(TypeError, match="MaxRetriesExceeded"):
            response_for_exception(json_request(), MaxRetriesExceeded(SimpleNamespace(name="r"), 3))


class TestAccept:
    @pytest.mark.parametrize(
        "accept",
        [
            None,
            "*/*",
            "application/json",
            "application/problem+json",
            "application/*",
            "text/plain;q=0.5, application/json",
            "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
            "application/json; charset=utf-8",
            "APPLICATION/JSON",
            "text/plain;q=0.5, */*;q=0.5",
            "application/json,,",
        ],
    )
    def test_json(self, accept):
        assert accepts_json(accept) is True

    @pytest.mark.parametrize(
        "accept",
        [
            "text/plain",
            "text/html",
            "text/*",
            "application/json;q=0.4, text/plain",
            "application/json;q=0",
            "*/*;q=0.9, text/plain",
            "*/*, application/*;q=0",
            "application/*;q=0.2, text/*;q=0.3",
            # malformed -> text
            "",
            "garbage",
            "application/json;q=2",
            "application/json;q=0.1234",
            "application/json;q",
            "*/json",
            "application/json;;=x",
            "appli cation/json",
            "application/json" + ", text/plain" * 300,
        ],
    )
    def test_text(self, accept):
        assert accepts_json(accept) is False

    def test_body_follows_accept(self):
        html = rf.get("/", HTTP_ACCEPT="text/html")
        assert response_for_exception(html, rejected(S))["Content-Type"].startswith("text/plain")
        assert response_for_exception(rf.get("/"), rejected(S))["Content-Type"] == "application/problem+json"


class TestBuilder:
    def test_dotted_path_builder(self):
        builder = resolve_response_builder("tests.test_responses.custom_builder")
        response = response_for_exception(text_request(), rejected(3 * S), builder=builder)
        assert response.content == b"custom api 3"
        assert response.status_code == 429
        assert response["Retry-After"] == "3"  # added for the builder
        assert response["Cache-Control"] == "no-store"

    def test_builder_keeps_its_own_retry_after(self):
        def builder(request, exc, *, status, retry_after):
            response = HttpResponse(status=status)
            response["Retry-After"] = "60"
            return response

        assert response_for_exception(text_request(), rejected(S), builder=builder)["Retry-After"] == "60"

    def test_resolve(self):
        assert resolve_response_builder(None) is None
        assert resolve_response_builder(custom_builder) is custom_builder
        with pytest.raises(ValueError, match="cannot import"):
            resolve_response_builder("tests.test_responses.nope")
        with pytest.raises(ValueError, match="not callable"):
            resolve_response_builder("tests.test_responses.S")
        with pytest.raises(ValueError, match="dotted path"):
            resolve_response_builder(42)  # type: ignore[arg-type]
