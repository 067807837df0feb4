"""Key specs compiled to request -> key functions."""

from __future__ import annotations

import hashlib

import pytest
from django.contrib.auth.models import AnonymousUser, User
from django.contrib.sessions.backends.db import SessionStore
from django.test import RequestFactory

from django_ratelimit_r4.ip import ClientIPResolver
from django_ratelimit_r4.keys import MAX_KEY_LENGTH, bound_key, compile_key, validate_key_spec

rf = RequestFactory()


def client_id(request):
    """Dotted-path key function used by the tests below."""
    return request.GET.get("client")


def numeric_key(request):
    return 7


NOT_CALLABLE = "just a string"


async def async_key(request):
    return "same"


class AsyncKey:
    async def __call__(self, request):
        return "same"


def key_of_view(request, view):
    """Takes more than the request: every request through it raised TypeError (a 500)."""
    return view


def key_with_defaults(request, field="tenant", *, prefix=""):
    return prefix + request.GET.get(field, "")


def make_request(*, user=None, session_key=None, remote="203.0.113.7", **extra):
    request = rf.get("/", REMOTE_ADDR=remote, **extra)
    if user is not None:
        request.user = user
    if session_key is not False:
        request.session = SessionStore(session_key=session_key)
    return request


def authed(pk: int = 42) -> User:
    return User(pk=pk, username=f"u{pk}")


class TestBuiltins:
    def test_ip(self):
        assert compile_key("ip")(make_request()) == "ip:203.0.113.7"

    def test_ip_uses_given_resolver(self):
        fn = compile_key("ip", ip_resolver=ClientIPResolver(1))
        assert fn(make_request(remote="10.0.0.1", HTTP_X_FORWARDED_FOR="198.51.100.5")) == "ip:198.51.100.5"

    def test_user(self):
        fn = compile_key("user")
        assert fn(make_request(user=authed(42))) == "user:42"
        assert fn(make_request(user=AnonymousUser())) is None
        assert fn(make_request()) is None  # no auth middleware

    def test_user_or_ip_prefixes(self):
        fn = compile_key("user_or_ip")
        assert fn(make_request(user=authed(42))) == "user:42"
        assert fn(make_request(user=AnonymousUser())) == "ip:203.0.113.7"
        assert fn(make_request()) == "ip:203.0.113.7"

    def test_user_or_ip_uses_resolver(self):
        fn = compile_key("user_or_ip", ip_resolver=ClientIPResolver(["10.0.0.0/8"]))
        r = make_request(user=AnonymousUser(), remote="10.0.0.1", HTTP_X_FORWARDED_FOR="198.51.100.5")
        assert fn(r) == "ip:198.51.100.5"

    @pytest.mark.django_db
    def test_session(self):
        fn = compile_key("session")
        known = SessionStore()
        known["cart"] = [1]
        known.save()
        assert fn(make_request(session_key=known.session_key)) == f"session:{known.session_key}"
        # Unknown to the store, not created yet, no session middleware: keyed as the client IP.
        assert fn(make_request(session_key="abcdefgh12345678")) == "ip:203.0.113.7"
        assert fn(make_request(session_key=None)) == "ip:203.0.113.7"
        assert fn(make_request(session_key=False)) == "ip:203.0.113.7"

    def test_header(self):
        fn = compile_key("header:X-Api-Key")
        assert fn(make_request(HTTP_X_API_KEY="k-123")) == "header:x-api-key:k-123"
        assert fn(make_request()) is None
        assert fn(make_request(HTTP_X_API_KEY="")) is None

    def test_header_name_is_case_insensitive(self):
        # One header, one namespace, however the spec spells its name.
        for spec in ("header:x-api-key", "header:X-API-KEY", "header:X_Api_Key"):
            assert compile_key(spec)(make_request(HTTP_X_API_KEY="k")) == "header:x-api-key:k"

    def test_content_type_header_has_no_http_prefix(self):
        request = rf.post("/", data="{}", content_type="application/json")
        assert compile_key("header:Content-Type")(request) == "header:content-type:application/json"

    def test_long_header_is_hashed(self):
        value = "k" * 10_000
        got = compile_key("header:X-Api-Key")(make_request(HTTP_X_API_KEY=value))
        assert got == "header:x-api-key:sha256:" + hashlib.sha256(value.encode()).hexdigest()
        assert len(got) < 100


class TestCustom:
    def test_dotted_path(self):
        fn = compile_key("tests.test_keys.client_id")
        assert fn(rf.get("/?client=abc")) == "tests.test_keys.client_id:abc"
        assert fn(rf.get("/")) is None

    def test_callable_object(self):
        assert compile_key(client_id)(rf.get("/?client=abc")) == "tests.test_keys.client_id:abc"
        fixed = compile_key(lambda r: "fixed")(rf.get("/"))
        assert fixed == "tests.test_keys.TestCustom.test_callable_object.<locals>.<lambda>:fixed"

    def test_non_string_result_is_stringified(self):
        assert compile_key("tests.test_keys.numeric_key")(rf.get("/")) == "tests.test_keys.numeric_key:7"

    def test_custom_result_is_bounded(self):
        long = "z" * (MAX_KEY_LENGTH + 1)
        assert compile_key(lambda r: long)(rf.get("/")).split(":", 1)[1].startswith("sha256:")


class TestBoundKey:
    def test_short_values_unchanged(self):
        assert bound_key("a" * MAX_KEY_LENGTH) == "a" * MAX_KEY_LENGTH

    def test_forged_digest_does_not_collide(self):
        long = "x" * 1000
        digest = bound_key(long)
        assert bound_key(digest) != digest


class TestValidation:
    @pytest.mark.parametrize(
        "spec",
        ["ip", "user", "user_or_ip", "session", "header:X-Api-Key", "tests.test_keys.client_id", None, len],
    )
    def test_valid(self, spec):
        assert validate_key_spec(spec) is None

    @pytest.mark.parametrize(
        ("spec", "fragment"),
        [
            ("ipp", "unknown key 'ipp'"),
            ("User", "unknown key 'User'"),
            ("header:", "header name after 'header:' is empty"),
            ("header:X Api", "not a valid HTTP header name"),
            ("header:Ünïcode", "not a valid HTTP header name"),
            ("tests.test_keys.missing", "cannot import key function 'tests.test_keys.missing'"),
            ("nope.module.fn", "cannot import"),
            ("tests.test_keys.NOT_CALLABLE", "is not callable"),
            (".ip", "unknown key"),
            (42, "must be a string or a callable"),
        ],
    )
    def test_invalid_message(self, spec, fragment):
        message = validate_key_spec(spec)
        assert message is not None and fragment in message
        with pytest.raises(ValueError, match=fragment.split("'")[0]):
            compile_key(spec)

    @pytest.mark.parametrize(
        "spec", ["tests.test_keys.key_of_view", key_of_view, lambda: "no request"], ids=["path", "function", "lambda"]
    )
    def test_a_key_function_that_cannot_take_the_request_alone_is_refused(self, spec):
        # It passed the decorator, manage.py check (E007) and compile_key: each request raised TypeError.
        from django.test import override_settings

        from django_ratelimit_r4.checks import check_settings
        from django_ratelimit_r4.decorators import ratelimit

        message = validate_key_spec(spec)
        assert message is not None and "cannot be called as key(request)" in message
        with pytest.raises(ValueError, match="cannot be called as key"):
            compile_key(spec)
        if callable(spec):
            with pytest.raises(TypeError, match="cannot be called as key"):
                ratelimit("api", key=spec)  # checked at decoration, as other specs
        else:
            with override_settings(RATELIMIT_R4={"ratelimiters": {"instances": {"t": {"rate": "5/m", "key": spec}}}}):
                assert [m.id for m in check_settings()] == ["ratelimit_r4.E007"]

    @pytest.mark.parametrize(
        "spec", ["tests.test_keys.async_key", async_key, AsyncKey()], ids=["path", "function", "callable object"]
    )
    def test_an_async_key_function_is_refused(self, spec):
        # Called as key(request), it returned a coroutine, never awaited, whose text was a new key on every
        # request: no limit at all (an async view with limit 10 answered 200 twelve times), and a warning each.
        from django.test import override_settings

        from django_ratelimit_r4.checks import check_settings
        from django_ratelimit_r4.decorators import ratelimit

        message = validate_key_spec(spec)
        assert message is not None and "is a coroutine function" in message and "plain def" in message
        with pytest.raises(ValueError, match="coroutine function"):
            compile_key(spec)
        if isinstance(spec, str):
            with override_settings(RATELIMIT_R4={"ratelimiters": {"instances": {"t": {"rate": "5/m", "key": spec}}}}):
                assert [m.id for m in check_settings()] == ["ratelimit_r4.E007"]
        else:
            with pytest.raises(TypeError, match="coroutine function"):
                ratelimit("api", key=spec)

    def test_a_key_function_with_defaults_or_a_builtin_is_fine(self):
        assert validate_key_spec("tests.test_keys.key_with_defaults") is None
        assert validate_key_spec(len) is None and validate_key_spec(str) is None

    def test_compile_none_is_an_error(self):
        with pytest.raises(ValueError, match="None"):
            compile_key(None)  # type: ignore[arg-type]
