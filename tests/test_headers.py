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
