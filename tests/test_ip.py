"""Client IP resolution: trust model, forged headers, malformed input, IPv6 grouping."""

from __future__ import annotations

import ipaddress

import pytest
from django.test import RequestFactory
from hypothesis import given, settings
from hypothesis import strategies as st

from django_ratelimit_r4.ip import UNKNOWN_CLIENT, ClientIPResolver

rf = RequestFactory()


def req(remote: str | None = "203.0.113.7", xff: str | None = None, fwd: str | None = None):
    extra = {}
    if xff is not None:
        extra["HTTP_X_FORWARDED_FOR"] = xff
    if fwd is not None:
        extra["HTTP_FORWARDED"] = fwd
    request = rf.get("/", **extra)
    if remote is None:
        del request.META["REMOTE_ADDR"]
    else:
        request.META["REMOTE_ADDR"] = remote
    return request


class TestNoProxies:
    def test_remote_addr_is_the_answer(self):
        assert ClientIPResolver()(req("198.51.100.1")) == "198.51.100.1"

    @pytest.mark.parametrize("trusted", [None, 0, []])
    def test_headers_ignored_without_trusted_proxies(self, trusted):
        r = ClientIPResolver(trusted)
        assert r(req("198.51.100.1", xff="1.1.1.1", fwd="for=2.2.2.2")) == "198.51.100.1"

    def test_ipv6_normalised(self):
        assert ClientIPResolver(ipv6_prefix_length=128)(req("2001:DB8:0:0::1")) == "2001:db8::1"

    def test_ipv4_mapped_ipv6_becomes_ipv4(self):
        assert ClientIPResolver()(req("::ffff:192.0.2.9")) == "192.0.2.9"

    def test_scope_id_dropped(self):
        assert ClientIPResolver(ipv6_prefix_length=128)(req("fe80::1%eth0")) == "fe80::1"

    @pytest.mark.parametrize("bad", [None, "", "not-an-ip", "999.1.1.1", "x" * 5000])
    def test_missing_or_malformed_remote_addr(self, bad):
        assert ClientIPResolver()(req(bad)) == UNKNOWN_CLIENT


class TestIPv6Grouping:
    def test_one_64_is_one_client_by_default(self):
        assert ClientIPResolver()(req("2001:db8:1:2:aaaa:bbbb:cccc:dddd")) == "2001:db8:1:2::/64"
        assert ClientIPResolver().ipv6_prefix_length == 64

    def test_slash_64(self):
        r = ClientIPResolver(ipv6_prefix_length=64)
        assert r(req("2001:db8:1:2:aaaa:bbbb:cccc:dddd")) == "2001:db8:1:2::/64"
        assert r(req("2001:db8:1:2::9")) == "2001:db8:1:2::/64"
        assert r(req("2001:db8:1:3::9")) == "2001:db8:1:3::/64"

    def test_ipv4_untouched_by_grouping(self):
        r = ClientIPResolver(ipv6_prefix_length=64)
        assert r(req("192.0.2.1")) == "192.0.2.1"
        assert r(req("::ffff:192.0.2.1")) == "192.0.2.1"

    def test_grouping_applies_to_forwarded_clients(self):
        r = ClientIPResolver(1, ipv6_prefix_length=48)
        assert r(req("10.0.0.1", xff="2001:db8:abcd:12::1")) == "2001:db8:abcd::/48"

    @pytest.mark.parametrize("bad", [0, 129, -1, True, "64", 64.0])
    def test_invalid_prefix_rejected_at_build_time(self, bad):
        with pytest.raises(ValueError, match="ipv6_prefix_length"):
            ClientIPResolver(ipv6_prefix_length=bad)


class TestProxyCount:
    def test_one_proxy_takes_rightmost(self):
        r = ClientIPResolver(1)
        assert r(req("10.0.0.1", xff="198.51.100.5")) == "198.51.100.5"

    def test_forged_prefix_is_ignored(self):
        # The client sent "X-Forwarded-For: 6.6.6.6"; the proxy appended the real peer.
        r = ClientIPResolver(1)
        assert r(req("10.0.0.1", xff="6.6.6.6, 198.51.100.5")) == "198.51.100.5"

    def test_two_proxies(self):
        r = ClientIPResolver(2)
        assert r(req("10.0.0.2", xff="6.6.6.6, 198.51.100.5, 10.0.0.1")) == "198.51.100.5"

    def test_fewer_hops_than_proxies_falls_back(self):
        r = ClientIPResolver(2)
        assert r(req("10.0.0.2", xff="198.51.100.5")) == "10.0.0.2"

    def test_no_header_falls_back(self):
        assert ClientIPResolver(1)(req("10.0.0.1")) == "10.0.0.1"

    def test_forwarded_header(self):
        r = ClientIPResolver(1, ipv6_prefix_length=128)
        assert (
            r(req("10.0.0.1", fwd='for=6.6.6.6, for="[2001:db8:cafe::17]:4711";proto=https'))
            == "2001:db8:cafe::17"
        )

    def test_ports_stripped(self):
        r = ClientIPResolver(1, ipv6_prefix_length=128)
        assert r(req("10.0.0.1", xff="198.51.100.5:51234")) == "198.51.100.5"
        assert r(req("10.0.0.1", xff="[2001:db8::5]:443")) == "2001:db8::5"

    def test_works_when_remote_addr_is_a_unix_socket(self):
        assert ClientIPResolver(1)(req("", xff="198.51.100.5")) == "198.51.100.5"

    @pytest.mark.parametrize(
        "xff", ["garbage", "198.51.100.5, unknown", "", " , ", "1.2.3.4, 999.0.0.1", "1.2.3.4," + "9" * 200]
    )
    def test_malformed_picks_remote_addr(self, xff):
        assert ClientIPResolver(1)(req("10.0.0.1", xff=xff)) == "10.0.0.1"

    def test_negative_count_rejected(self):
        with pytest.raises(ValueError):
            ClientIPResolver(-1)

    @pytest.mark.parametrize("forged", ["garbage", "6.6.6.6", "for=6.6.6.6"])
    @pytest.mark.parametrize("count", [1, 2])
    def test_any_number_of_forged_entries_left_of_the_proxies_is_ignored(self, forged, count):
        # The client writes what it likes left of what the proxies append: 1 000 entries of it must not
        # make the answer the proxy's own address (a budget the client would share with every such request).
        proxies = ["10.0.0.9"] * (count - 1)
        xff = ", ".join([forged] * 1000 + ["198.51.100.5", *proxies])
        fwd = ", ".join([f"for={forged}"] * 1000 + ["for=198.51.100.5", *(f"for={p}" for p in proxies)])
        resolver = ClientIPResolver(count)
        assert resolver(req("10.0.0.1", xff=xff)) == "198.51.100.5"
        assert resolver(req("10.0.0.1", fwd=fwd)) == "198.51.100.5"
        assert resolver(req("10.0.0.1", xff=xff, fwd=fwd)) == "198.51.100.5"


class TestTrustedCIDRs:
    resolver = ClientIPResolver(["10.0.0.0/8", "2001:db8:ffff::/48"])

    def test_untrusted_peer_headers_never_change_the_answer(self):
        for xff in ["1.1.1.1", "10.0.0.5", "1.1.1.1, 2.2.2.2", "garbage"]:
            assert self.resolver(req("198.51.100.9", xff=xff)) == "198.51.100.9"
        assert self.resolver(req("198.51.100.9", fwd="for=1.1.1.1")) == "198.51.100.9"

    def test_walks_from_the_right_skipping_trusted(self):
        r = req("10.0.0.1", xff="6.6.6.6, 198.51.100.5, 10.1.1.1, 10.2.2.2")
        assert self.resolver(r) == "198.51.100.5"

    def test_ipv6_trusted_hops(self):
        r = req("2001:db8:ffff::1", xff="198.51.100.5, 2001:db8:ffff:1::2")
        assert self.resolver(r) == "198.51.100.5"

    def test_all_trusted_returns_leftmost(self):
        assert self.resolver(req("10.0.0.1", xff="10.9.9.9, 10.0.0.2")) == "10.9.9.9"

    def test_malformed_hop_falls_back_to_remote_addr(self):
        assert self.resolver(req("10.0.0.1", xff="198.51.100.5, _hidden")) == "10.0.0.1"
        assert self.resolver(req("10.0.0.1", fwd="for=unknown")) == "10.0.0.1"
        assert self.resolver(req("10.0.0.1", fwd="proto=https")) == "10.0.0.1"

    def test_malformed_left_of_the_client_does_not_matter(self):
        assert self.resolver(req("10.0.0.1", xff="garbage, 198.51.100.5")) == "198.51.100.5"

    @pytest.mark.parametrize("forged", ["garbage", "6.6.6.6", "10.0.0.7"])
    def test_any_number_of_entries_left_of_the_client_does_not_matter(self, forged):
        # The walk stops at the first untrusted hop: what the client wrote before it is never read, however long.
        hops = [forged] * 1000 + ["198.51.100.5", *["10.0.0.2"] * 63]
        assert self.resolver(req("10.0.0.1", xff=", ".join(hops))) == "198.51.100.5"
        assert self.resolver(req("10.0.0.1", fwd=", ".join(f"for={h}" for h in hops))) == "198.51.100.5"

    def test_forwarded_multiple_fields_joined(self):
        r = req("10.0.0.1", fwd='for=6.6.6.6;by=10.0.0.1, For="198.51.100.5";proto=http, for=10.0.0.3')
        assert self.resolver(r) == "198.51.100.5"

    def test_ipv4_mapped_remote_addr_matches_ipv4_network(self):
        assert self.resolver(req("::ffff:10.0.0.1", xff="198.51.100.5")) == "198.51.100.5"

    def test_ipv4_mapped_network_spec_matches_ipv4_peer(self):
        r = ClientIPResolver(["::ffff:10.0.0.0/104"])
        assert r(req("10.0.0.1", xff="198.51.100.5")) == "198.51.100.5"

    def test_too_many_hops_falls_back(self):
        xff = ", ".join(["10.0.0.1"] * 100)
        assert self.resolver(req("10.0.0.1", xff="198.51.100.5, " + xff)) == "10.0.0.1"

    @pytest.mark.parametrize("bad", [["nope"], ["10.0.0.0/33"], [None], "10.0.0.0/8", True])
    def test_bad_config_rejected_at_build_time(self, bad):
        with pytest.raises(ValueError, match="trusted_proxies"):
            ClientIPResolver(bad)


class TestTwoHeaders:
    def test_forged_second_header_is_detected(self):
        # The proxy writes X-Forwarded-For; the client forged Forwarded.
        r = ClientIPResolver(1)
        assert r(req("10.0.0.1", xff="198.51.100.5", fwd="for=1.2.3.4")) == "10.0.0.1"

    def test_agreeing_headers_are_fine(self):
        r = ClientIPResolver(1)
        assert r(req("10.0.0.1", xff="198.51.100.5", fwd="for=198.51.100.5")) == "198.51.100.5"

    def test_pinned_header_ignores_the_other(self):
        xff_only = ClientIPResolver(1, forwarded_header="x-forwarded-for")
        fwd_only = ClientIPResolver(1, forwarded_header="forwarded")
        r = req("10.0.0.1", xff="198.51.100.5", fwd="for=1.2.3.4")
        assert xff_only(r) == "198.51.100.5"
        assert fwd_only(r) == "1.2.3.4"
        assert fwd_only(req("10.0.0.1", xff="198.51.100.5")) == "10.0.0.1"

    def test_bad_header_name(self):
        with pytest.raises(ValueError, match="forwarded_header"):
            ClientIPResolver(1, forwarded_header="x-real-ip")  # type: ignore[arg-type]


def test_cache_never_stores_long_strings():
    r = ClientIPResolver(1)
    for i in range(50):
        r(req("10.0.0.1", xff=f"{i}" * 100))
    assert r._cache.cache_info().currsize <= 1


_header_text = st.text(alphabet=st.sampled_from(list('0123456789abcdef.:,;=[]" _%forFOR')), max_size=60)


@settings(max_examples=300, deadline=None)
@given(
    remote=st.one_of(_header_text, st.ip_addresses().map(str)),
    xff=st.one_of(st.none(), _header_text),
    fwd=st.one_of(st.none(), _header_text),
    trusted=st.sampled_from([None, 1, 2, ["10.0.0.0/8"], ["0.0.0.0/0", "::/0"]]),
)
def test_never_raises_and_returns_an_ip_or_unknown(remote, xff, fwd, trusted):
    result = ClientIPResolver(trusted, ipv6_prefix_length=64)(req(remote, xff=xff, fwd=fwd))
    assert isinstance(result, str)
    if result != UNKNOWN_CLIENT:
        ipaddress.ip_network(result)  # an address or a /64 group


@settings(max_examples=200, deadline=None)
@given(forged=st.lists(st.one_of(st.ip_addresses().map(str), _header_text), max_size=5))
def test_untrusted_peer_cannot_buy_a_new_identity(forged):
    resolver = ClientIPResolver(["10.0.0.0/8"])
    joined = ", ".join(forged)
    assert resolver(req("198.51.100.9", xff=joined, fwd=joined)) == "198.51.100.9"


@settings(max_examples=300, deadline=None)
@given(
    remote=st.one_of(st.none(), _header_text, st.ip_addresses().map(str), st.just("1" * 200)),
    xff=st.one_of(st.none(), _header_text),
    trusted=st.sampled_from([None, 0, [], 1, ["10.0.0.0/8"]]),
    prefix=st.sampled_from([128, 64]),
)
def test_as_function_answers_like_the_resolver(remote, xff, trusted, prefix):
    """The plain function the key specs use (a REMOTE_ADDR-only closure without proxies) is exact."""
    resolver = ClientIPResolver(trusted, ipv6_prefix_length=prefix)
    request = req(remote, xff=xff)
    assert resolver.as_function()(request) == ClientIPResolver(trusted, ipv6_prefix_length=prefix)(request)


def test_as_function_without_proxies_reads_only_remote_addr_and_bounds_its_cache():
    resolver = ClientIPResolver()
    client_ip = resolver.as_function()
    assert client_ip.__name__ == "remote_addr"  # not the general __call__
    assert client_ip(req("198.51.100.1", xff="1.1.1.1", fwd="for=2.2.2.2")) == "198.51.100.1"
    assert client_ip(req("::ffff:192.0.2.1")) == "192.0.2.1"
    assert client_ip(req(None)) == UNKNOWN_CLIENT
    assert client_ip(req("9" * 500)) == UNKNOWN_CLIENT
    assert resolver._cache.cache_info().currsize == 3  # the 500-char string was never stored


def test_as_function_with_proxies_is_the_general_resolver():
    resolver = ClientIPResolver(1)
    assert resolver.as_function() == resolver.__call__
    assert resolver.as_function()(req("10.0.0.1", xff="203.0.113.7")) == "203.0.113.7"


# One source for the proxy rules (issue 10, item 3): the settings and ClientIPResolver ask ip.py alike.
_PROXY_VALUES = [
    0,
    2,
    -1,
    True,
    "10.0.0.0/8",
    ["10.0.0.0/8", "unix"],
    ["::ffff:10.0.0.0/104"],
    ["10.0.0.0/33"],
    ["proxy", 7],
    (),
    3.5,
]


@pytest.mark.parametrize("value", _PROXY_VALUES, ids=repr)
def test_settings_and_resolver_agree_on_trusted_proxies(value) -> None:
    from django_ratelimit_r4 import conf

    try:
        conf._option_trusted_proxies(value, {})
        settings_ok = True
    except conf._Invalid:
        settings_ok = False
    try:
        ClientIPResolver(value)
        resolver_ok = True
    except ValueError:
        resolver_ok = False
    assert settings_ok == resolver_ok


@pytest.mark.parametrize("value", [0, 1, 64, 128, 129, True, "64"], ids=repr)
def test_settings_and_resolver_agree_on_ipv6_prefix_length(value) -> None:
    from django_ratelimit_r4 import conf

    try:
        conf._option_ipv6_prefix(value, {})
        settings_ok = True
    except conf._Invalid:
        settings_ok = False
    try:
        ClientIPResolver(None, value)
        resolver_ok = True
    except ValueError:
        resolver_ok = False
    assert settings_ok == resolver_ok


@pytest.mark.parametrize("value", ["auto", "Forwarded", "x-forwarded-for", "x-real-ip", None], ids=repr)
def test_settings_and_resolver_agree_on_forwarded_header(value) -> None:
    from django_ratelimit_r4 import conf

    try:
        conf._option_forwarded_header(value, {})
        settings_ok = True
    except conf._Invalid:
        settings_ok = False
    try:
        ClientIPResolver(1, forwarded_header=value)
        resolver_ok = True
    except ValueError:
        resolver_ok = False
    assert settings_ok == resolver_ok


def test_conf_has_no_proxy_rules_of_its_own() -> None:
    """conf calls ip.py's parse_* functions; the network parsing and the header list are not repeated there."""
    from pathlib import Path

    import django_ratelimit_r4

    source = (Path(django_ratelimit_r4.__file__).parent / "conf.py").read_text(encoding="utf-8")
    assert "ip_network(" not in source
    assert "_FORWARDED_HEADERS" not in source and "UNIX_PEER" not in source
