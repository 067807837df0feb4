"""RateLimit header fields: exact strings for both styles."""

from __future__ import annotations

import base64

import pytest

from django_ratelimit_r4.headers import (
    QuotaStatus,
    delay_seconds,
    draft6_headers,
    draft10_headers,
    partition_key,
    ratelimit_headers,
    sf_string,
    window_seconds,
)

API_EXHAUSTED = QuotaStatus("api", limit=10, window=1, remaining=0, reset=1)


class TestDraft10:
    def test_single_policy(self):
        assert draft10_headers([API_EXHAUSTED]) == {
            "RateLimit-Policy": '"api";q=10;w=1',
            "RateLimit": '"api";r=0;t=1',
        }

    def test_several_policies_joined_in_order(self):
        statuses = [
            QuotaStatus("burst", 10, 1, 3, 1),
            QuotaStatus("sustained", 1000, 3600, 640, 1789),
        ]
        assert draft10_headers(statuses) == {
            "RateLimit-Policy": '"burst";q=10;w=1, "sustained";q=1000;w=3600',
            "RateLimit": '"burst";r=3;t=1, "sustained";r=640;t=1789',
        }

    def test_partition_key_is_hashed_never_raw(self):
        headers = draft10_headers([QuotaStatus("api", 10, 60, 7, 50, key="203.0.113.7")])
        assert headers == {
            "RateLimit-Policy": '"api";q=10;w=60;pk=:/sUlZaoM8Y9X189b:',
            "RateLimit": '"api";r=7;t=50;pk=:/sUlZaoM8Y9X189b:',
        }
        assert "203.0.113.7" not in "".join(headers.values())

    def test_salt_changes_pk(self):
        headers = draft10_headers([QuotaStatus("api", 10, 1, 0, 1, key="203.0.113.7")], salt=b"salt")
        assert headers["RateLimit"] == '"api";r=0;t=1;pk=:SjqtTbnbQb+ztzhR:'

    def test_negative_remaining_sent_as_zero(self):
        headers = draft10_headers([QuotaStatus("api", 2, 1, -3, 2)])
        assert headers["RateLimit"] == '"api";r=0;t=2'

    def test_huge_values_clamped_to_valid_sf_integers(self):
        headers = draft10_headers([QuotaStatus("api", 10**18, 1, 10**18, 0)])
        assert headers["RateLimit-Policy"] == '"api";q=999999999999999;w=1'
        assert headers["RateLimit"] == '"api";r=999999999999999;t=0'

    def test_policy_name_escaped(self):
        headers = draft10_headers([QuotaStatus('we"ird\\näme', 1, 1, 1, 0)])
        assert headers["RateLimit-Policy"] == '"we\\"ird\\\\n_me";q=1;w=1'

    def test_empty(self):
        assert draft10_headers([]) == {}


class TestDraft6:
    def test_single_policy(self):
        assert draft6_headers([API_EXHAUSTED]) == {
            "RateLimit-Limit": "10",
            "RateLimit-Remaining": "0",
            "RateLimit-Reset": "1",
            "RateLimit-Policy": "10;w=1",
        }

    def test_several_policies_report_the_closest_to_exhaustion(self):
        statuses = [
            QuotaStatus("burst", 10, 1, 3, 1),
            QuotaStatus("sustained", 1000, 3600, 2, 1789),
        ]
        assert draft6_headers(statuses) == {
            "RateLimit-Limit": "1000",
            "RateLimit-Remaining": "2",
            "RateLimit-Reset": "1789",
            "RateLimit-Policy": "10;w=1, 1000;w=3600",
        }

    def test_tie_on_remaining_picks_longest_reset(self):
        statuses = [QuotaStatus("a", 10, 1, 0, 1), QuotaStatus("b", 100, 60, 0, 42)]
        assert draft6_headers(statuses)["RateLimit-Reset"] == "42"

    def test_no_raw_key_anywhere(self):
        headers = draft6_headers([QuotaStatus("api", 10, 1, 5, 1, key="secret-key")])
        assert "secret-key" not in repr(headers)


class TestDispatch:
    def test_styles(self):
        assert ratelimit_headers("draft-10", [API_EXHAUSTED]) == draft10_headers([API_EXHAUSTED])
        assert ratelimit_headers("draft-6", [API_EXHAUSTED]) == draft6_headers([API_EXHAUSTED])
        assert ratelimit_headers(None, [API_EXHAUSTED]) == {}

    def test_unknown_style(self):
        with pytest.raises(ValueError, match="draft-10"):
            ratelimit_headers("draft-7", [API_EXHAUSTED])


class TestRounding:
    @pytest.mark.parametrize(
        ("period_ns", "w"),
        [
            (1, 1),
            (100_000_000, 1),
            (999_999_999, 1),
            (1_000_000_000, 1),
            (1_000_000_001, 2),
            (1_500_000_000, 2),
            (60_000_000_000, 60),
        ],
    )
    def test_window_rounds_up_to_a_positive_integer(self, period_ns, w):
        assert window_seconds(period_ns) == w

    @pytest.mark.parametrize(
        ("wait_ns", "t"),
        [(-5, 0), (0, 0), (1, 1), (999_999_999, 1), (1_000_000_000, 1), (50_000_000_001, 51)],
    )
    def test_delay_seconds_rounds_up(self, wait_ns, t):
        assert delay_seconds(wait_ns) == t


def test_partition_key_shape():
    pk = partition_key("user:42")
    assert pk.startswith(":") and pk.endswith(":")
    assert len(base64.b64decode(pk[1:-1])) == 12
    assert partition_key("user:42") == pk
    assert partition_key("user:43") != pk


def test_sf_string_plain():
    assert sf_string("api") == '"api"'


# ------------------------------------------------------------------------------------------------ writing
# headers.py is the only module that touches Django's private ResponseHeaders._store: these tests notice a
# Django that changed its layout, and show that the fields then take the public API with the same result.


class _HeadersWithoutStore:
    """A response-headers mapping of some other shape (what a future Django might have)."""

    def __init__(self, data: dict) -> None:
        self._data = {k.lower(): (k, v) for k, v in data.items()}

    def __setitem__(self, name: str, value: str) -> None:
        self._data[name.lower()] = (name, value)

    def get(self, name: str, default=None):
        item = self._data.get(name.lower())
        return default if item is None else item[1]

    def items(self):
        return list(self._data.values())


class _HeadersWithOtherStore(_HeadersWithoutStore):
    """A ``_store`` dict that maps lower-case names to bare values (not Django's ``(name, value)``)."""

    @property
    def _store(self) -> dict:
        return {k: v for k, (_, v) in self._data.items()}


def test_the_installed_django_has_the_layout_headers_writes_into():
    """If this fails, Django changed ResponseHeaders: the fields still work, through the public API."""
    from django_ratelimit_r4 import headers

    assert headers.store_layout_ok() is True
    assert headers.STORE_LAYOUT_OK is True


@pytest.mark.parametrize("cls", [_HeadersWithoutStore, _HeadersWithOtherStore, object])
def test_a_changed_layout_is_detected(cls):
    from django_ratelimit_r4 import headers

    assert headers.store_layout_ok(cls) is False


def _written(response) -> dict:
    return {name: response[name] for name in ("RateLimit-Policy", "RateLimit")}


def test_write_draft10_through_the_store_matches_the_public_api(settings):
    from django.http import HttpResponse

    from django_ratelimit_r4 import headers

    fast = HttpResponse()
    headers.write_draft10(fast, '"api";q=10;w=1', '"api";r=', 3, 1_500_000_000, ";pk=:x:")
    assert _written(fast) == {"RateLimit-Policy": '"api";q=10;w=1', "RateLimit": '"api";r=3;t=2;pk=:x:'}
    assert ("RateLimit", '"api";r=3;t=2;pk=:x:') in list(fast.items())  # what the server sends
    reference = draft10_headers([QuotaStatus("api", 10, 1, 3, 2)])
    plain = HttpResponse()
    headers.write_draft10(plain, reference["RateLimit-Policy"], '"api";r=', 3, 1_500_000_000)
    assert _written(plain) == reference


def test_write_draft10_falls_back_to_the_public_api_when_the_layout_changed(monkeypatch):
    from django.http import HttpResponse

    from django_ratelimit_r4 import headers

    monkeypatch.setattr(headers, "STORE_LAYOUT_OK", False)
    response = HttpResponse()
    response.headers._store = None  # would raise if written into
    monkeypatch.setattr(
        type(response), "__setitem__", lambda self, name, value: calls.append((name, value)), raising=True
    )
    calls: list = []
    headers.write_draft10(response, '"api";q=10;w=1', '"api";r=', -4, 0)
    assert calls == [("RateLimit-Policy", '"api";q=10;w=1'), ("RateLimit", '"api";r=0;t=0')]


def test_write_draft10_on_a_response_without_django_headers():
    """A response class of its own (no ``headers._store``): the public ``response[name] = value``."""
    from django_ratelimit_r4 import headers

    class Response(dict):
        headers = _HeadersWithoutStore({})

    response = Response()
    headers.write_draft10(response, '"api";q=10;w=1', '"api";r=', 10**20, 10**30)
    assert response == {"RateLimit-Policy": '"api";q=10;w=1', "RateLimit": '"api";r=999999999999999;t=999999999999999'}


def test_a_view_gets_the_same_fields_without_the_fast_store(monkeypatch, r4_clock):
    """Through @ratelimit (the hot path), a Django without the known layout gives identical headers."""
    from django.http import HttpResponse
    from django.test import RequestFactory

    from django_ratelimit_r4 import headers
    from django_ratelimit_r4.decorators import ratelimit

    @ratelimit("api")
    def view(request):
        return HttpResponse("ok")

    fast = _written(view(RequestFactory().get("/")))
    monkeypatch.setattr(headers, "STORE_LAYOUT_OK", False)
    slow = _written(view(RequestFactory().get("/")))
    assert fast == {"RateLimit-Policy": '"api";q=10;w=1', "RateLimit": '"api";r=9;t=1'}
    assert slow == {"RateLimit-Policy": '"api";q=10;w=1', "RateLimit": '"api";r=8;t=1'}


def test_only_headers_touches_django_private_store():
    """No other module reads ``<something>.headers._store`` or ``getattr(..., "_store")``."""
    import ast
    from pathlib import Path

    import django_ratelimit_r4

    root = Path(django_ratelimit_r4.__file__).parent

    def touches(path: Path) -> bool:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr == "_store" and isinstance(node.value, ast.Attribute):
                return True
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", "") == "getattr"
                and any(isinstance(a, ast.Constant) and a.value == "_store" for a in node.args)
            ):
                return True
        return False

    assert sorted(str(p.relative_to(root)) for p in root.rglob("*.py") if touches(p)) == ["headers.py"]


@pytest.mark.parametrize("remaining", [-5, 0, 1, 7, 999_999_999_999_999, 10**16])
@pytest.mark.parametrize("reset_ns", [-1, 0, 1, 999_999_999, 1_000_000_000, 1_000_000_001, 10**30])
def test_write_draft10_formats_as_draft10_state(remaining, reset_ns):
    """write_draft10 inlines draft10_state for the hot path: both give the same member."""
    from django.http import HttpResponse

    from django_ratelimit_r4.headers import draft10_state, write_draft10

    response = HttpResponse()
    write_draft10(response, "p", '"a";r=', remaining, reset_ns, ";pk=:x:")
    assert response["RateLimit"] == draft10_state('"a";r=', remaining, delay_seconds(reset_ns), ";pk=:x:")
