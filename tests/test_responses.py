"""429/503 responses: status, Retry-After, problem+json vs text, caching, custom builders."""

from __future__ import annotations

import html
import json
from types import SimpleNamespace

import pytest
from django.http import HttpResponse
from django.test import Client, RequestFactory
from hypothesis import given
from hypothesis import strategies as st

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

    def test_violated_policies_name_the_rejecting_limiter(self):
        # Nothing sets a ``violated_policies`` attribute on an exception: an ad-hoc one is not read.
        exc = rejected(S)
        exc.violated_policies = ["burst", "sustained"]
        body = json.loads(response_for_exception(json_request(), exc).content)
        assert body["violated-policies"] == ["api"]

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
            "application/json; charset=utf-8",
            "APPLICATION/JSON",
            "application/json,,",
            "application/problem+json, text/html;q=0.9",
            "text/html;q=0, */*",
            "*/*, text/*;q=0.5",
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
            # browsers: text/html named, JSON only through */*
            "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
            "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8",
            # the same q: a type named explicitly beats */*
            "text/plain;q=0.5, */*;q=0.5",
            "image/png",
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
        browser = rf.get("/", HTTP_ACCEPT="text/html")
        assert response_for_exception(browser, rejected(S))["Content-Type"] == "text/html; charset=utf-8"
        assert response_for_exception(rf.get("/"), rejected(S))["Content-Type"] == "application/problem+json"
        assert response_for_exception(text_request(), rejected(S))["Content-Type"] == "text/plain; charset=utf-8"

    @pytest.mark.parametrize(
        ("accept", "content_type"),
        [
            ("text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", "text/html; charset=utf-8"),
            ("text/*", "text/html; charset=utf-8"),
            ("text/plain, text/html;q=0.5", "text/plain; charset=utf-8"),
            ("text/html, application/json", "text/html; charset=utf-8"),  # the same q: the client's order
            ("application/json, text/html", "application/problem+json"),
            ("*/*", "application/problem+json"),
            ("*/*;q=0.8, text/html;q=0", "application/problem+json"),
            ("text/html;q=0.5, */*", "application/problem+json"),  # */* gives JSON the higher q
        ],
    )
    def test_negotiation(self, accept, content_type):
        assert response_for_exception(rf.get("/", HTTP_ACCEPT=accept), rejected(S))["Content-Type"] == content_type

    def test_html_body_is_small_escaped_and_says_when(self):
        response = response_for_exception(rf.get("/", HTTP_ACCEPT="text/html"), rejected(30 * S, name="<b>api</b>"))
        page = response.content.decode()
        assert page.startswith("<!DOCTYPE html>") and len(page) < 600
        assert "<title>429 Too Many Requests</title>" in page
        assert html.escape("RateLimiter '<b>api</b>' does not permit further calls; retry after 30 seconds.") in page
        assert "<b>api</b>" not in page
        unavailable = response_for_exception(rf.get("/", HTTP_ACCEPT="text/html"), broken(3 * S)).content.decode()
        assert "<title>503 Service Unavailable</title>" in unavailable

    @pytest.mark.django_db(databases=[])
    def test_a_browser_gets_html_through_a_view(self, r4_clock):
        client = Client()
        for _ in range(10):
            client.get("/api/")
        browser = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
        page = client.get("/api/", HTTP_ACCEPT=browser)
        assert (page.status_code, page["Content-Type"], page["Retry-After"]) == (429, "text/html; charset=utf-8", "1")
        assert page["Vary"] == "Accept" and b"Too Many Requests" in page.content
        assert client.get("/api/", HTTP_ACCEPT="application/json").json()["status"] == 429
        for malformed in ("text/html;q=2", "\x00", "*/html", "text/html;;", "t" * 5000, ",;,", "a/b;q=0.1234"):
            answer = client.get("/api/", HTTP_ACCEPT=malformed)
            assert (answer.status_code, answer["Content-Type"]) == (429, "text/plain; charset=utf-8")


_MEDIA = st.sampled_from(
    ["*/*", "text/*", "application/*", "text/html", "text/plain", "application/json", "application/problem+json",
     "application/xml", "image/webp", "TEXT/HTML", "*/json"]
)
_Q = st.one_of(st.none(), st.sampled_from(["0", "0.5", "1", "1.000", "0.001", "2", "-1", "x", "0.1234", ""]))
_PARAM = st.one_of(_Q.map(lambda q: "" if q is None else f";q={q}"), st.sampled_from([";level=1", "; charset=utf-8", ";", ";=x"]))
_ELEMENT = st.tuples(_MEDIA, _PARAM, st.sampled_from(["", " ", "\t"])).map(lambda t: t[2] + t[0] + t[1])
_ACCEPT = st.one_of(
    st.lists(_ELEMENT, max_size=8).map(",".join),
    st.text(max_size=200),
    st.text(alphabet=st.sampled_from("*/;=,q.0123456789 texhmlapij+"), max_size=300),
)
_CONTENT_TYPES = {"application/problem+json", "text/plain; charset=utf-8", "text/html; charset=utf-8"}


@given(accept=_ACCEPT)
def test_any_accept_header_gets_a_429_never_an_error(accept):
    """Fuzz: whatever the client sends in Accept, the answer is a 429 in one of the three bodies."""
    try:
        request = rf.get("/", HTTP_ACCEPT=accept)
    except ValueError:  # the test client refuses some header values outright; a server would too
        return
    response = response_for_exception(request, rejected(2 * S))
    assert response.status_code == 429 and response["Retry-After"] == "2"
    assert response["Content-Type"] in _CONTENT_TYPES
    if response["Content-Type"] == "application/problem+json":
        assert json.loads(response.content)["retry_after"] == 2
        assert accepts_json(accept)
    else:
        assert b"retry after 2 seconds" in response.content
        assert not accepts_json(accept)


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
