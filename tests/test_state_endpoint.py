"""The state endpoint: 404 for everyone not allowed, the snapshot for staff and token, POST actions,
and ``manage.py r4 --url`` against a live server."""

from __future__ import annotations

import copy
import io
import json
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import Client

from django_ratelimit_r4 import get_circuit_breaker, get_rate_limiter

TOKEN = "t0ken-" + "x" * 40
BASE = "/ops/r4/"


@pytest.fixture
def ops(settings: Any, r4_clock: Any) -> Any:
    """Test settings plus a token, the operations URLconf, fresh instances on a fake clock."""
    config = copy.deepcopy(django_settings.RATELIMIT_R4)
    config["state_endpoint_token"] = TOKEN
    config["ratelimiters"]["instances"]["per_ip"] = {"limit_for_period": 3, "key": "ip"}
    settings.RATELIMIT_R4 = config
    settings.ROOT_URLCONF = "tests.state_urls"
    return r4_clock


def _bearer(token: str = TOKEN) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


def _user(db: Any, **flags: Any) -> Any:
    name = "user-" + "-".join(sorted(k for k, v in flags.items() if v)) + f"-{len(flags)}"
    return get_user_model().objects.create_user(username=name, password="pw", **flags)


def _by(items: list[dict[str, Any]], type_: str, name: str) -> dict[str, Any]:
    return next(i for i in items if i["type"] == type_ and i["name"] == name)


# --------------------------------------------------------------------------------------- access


@pytest.mark.parametrize("method", ["get", "post"])
@pytest.mark.parametrize("path", [BASE, BASE + "api/reset", BASE + "api/drain", BASE + "acquirer/transition"])
def test_anonymous_gets_a_plain_404(ops: Any, client: Client, method: str, path: str) -> None:
    response = getattr(client, method)(path)
    assert response.status_code == 404
    assert "X-R4-Worker-Pid" not in response
    assert b"ratelimiter" not in response.content


@pytest.mark.parametrize("header", [f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", "Bearer ", f"Basic {TOKEN}"])
def test_wrong_token_gets_404(ops: Any, client: Client, header: str) -> None:
    assert client.get(BASE, HTTP_AUTHORIZATION=header).status_code == 404
    assert client.post(BASE + "slow/drain", HTTP_AUTHORIZATION=header).status_code == 404
    assert get_rate_limiter("slow").metrics.available_permissions == 10  # nothing was drained


def test_no_token_configured_means_no_token_access(settings: Any, client: Client) -> None:
    settings.ROOT_URLCONF = "tests.state_urls"
    assert client.get(BASE, **_bearer()).status_code == 404
    assert client.get(BASE, HTTP_AUTHORIZATION="Bearer ").status_code == 404


def test_wrong_token_is_refused_even_for_staff(ops: Any, client: Client, db: Any) -> None:
    client.force_login(_user(db, is_staff=True))
    assert client.get(BASE).status_code == 200
    assert client.get(BASE, **_bearer("nope")).status_code == 404


def test_non_staff_and_inactive_users_get_404(ops: Any, client: Client, db: Any) -> None:
    client.force_login(_user(db))
    assert client.get(BASE).status_code == 404
    inactive = _user(db, is_staff=True, is_active=False)
    client.force_login(inactive)
    assert client.get(BASE).status_code == 404


def test_staff_gets_the_snapshot(ops: Any, client: Client, db: Any) -> None:
    client.force_login(_user(db, is_staff=True))
    for _ in range(11):
        get_rate_limiter("api").acquire_permission()
    response = client.get(BASE)
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert response["X-R4-Worker-Pid"].isdigit()
    assert "no-cache" in response["Cache-Control"]
    items = response.json()
    assert {i["type"] for i in items} == {"ratelimiter", "bulkhead", "circuitbreaker", "retry", "timelimiter"}
    api = _by(items, "ratelimiter", "api")
    assert api["config"]["limit_for_period"] == 10 and api["config"]["limit_refresh_period"] == "1s"
    assert api["state"]["available_permissions"] == 0
    assert (api["state"]["successful_calls"], api["state"]["failed_calls"]) == (10, 1)


def test_token_gets_the_snapshot_and_filters_by_name(ops: Any, client: Client) -> None:
    get_circuit_breaker("acquirer").transition_to_open_state()
    items = client.get(BASE + "?name=api&name=circuitbreaker:acquirer", **_bearer()).json()
    assert [(i["type"], i["name"]) for i in items] == [("ratelimiter", "api"), ("circuitbreaker", "acquirer")]
    breaker = items[1]["state"]
    assert breaker["state"] == "OPEN" and breaker["remaining_open_ns"] == 3_000_000_000
    unknown = client.get(BASE + "?name=nope", **_bearer())
    assert unknown.status_code == 404 and "nope" in unknown.json()["error"]


# ------------------------------------------------------------------------------------ client keys


def _use_key(client: Client, key: str) -> None:
    get_rate_limiter("per_ip", key=key).acquire_permission()


def test_client_keys_are_never_shown_unless_asked(ops: Any, client: Client) -> None:
    _use_key(client, "203.0.113.7")
    response = client.get(BASE, **_bearer())
    assert b"203.0.113.7" not in response.content
    keyed = _by(response.json(), "ratelimiter", "per_ip")["state"]["keyed"]
    assert keyed["live_keys"] == 1 and "keys" not in keyed


def test_token_may_list_client_keys(ops: Any, client: Client) -> None:
    _use_key(client, "203.0.113.7")
    keyed = _by(client.get(BASE + "?keys=1", **_bearer()).json(), "ratelimiter", "per_ip")["state"]["keyed"]
    assert keyed["keys"] == {"203.0.113.7": {"available_permissions": 2, "nanos_to_wait": 0}}


def test_staff_needs_the_permission_for_client_keys(ops: Any, client: Client, db: Any) -> None:
    _use_key(client, "203.0.113.7")
    client.force_login(_user(db, is_staff=True))
    denied = client.get(BASE + "?keys=1")
    assert denied.status_code == 403
    assert b"203.0.113.7" not in denied.content and "view_keys" in denied.json()["error"]
    client.force_login(_user(db, is_staff=True, is_superuser=True))
    allowed = client.get(BASE + "?keys=1")
    assert b"203.0.113.7" in allowed.content


# ---------------------------------------------------------------------------------------- actions


def test_token_actions_with_json_and_form_bodies(ops: Any, client: Client) -> None:
    drained = client.post(BASE + "slow/drain", **_bearer())
    assert drained.status_code == 200 and drained.json()["drained"] == 10
    assert get_rate_limiter("slow").metrics.available_permissions == 0
    assert client.post(BASE + "slow/reset", **_bearer()).json()["action"] == "reset"
    assert get_rate_limiter("slow").metrics.available_permissions == 10

    moved = client.post(
        BASE + "acquirer/transition",
        data=json.dumps({"to": "forced_open"}),
        content_type="application/json",
        **_bearer(),
    )
    assert moved.status_code == 200
    assert (moved.json()["from_state"], moved.json()["to_state"]) == ("CLOSED", "FORCED_OPEN")
    form = client.post(BASE + "acquirer/transition", data={"to": "CLOSED"}, **_bearer())
    assert form.json()["to_state"] == "CLOSED"
    assert get_circuit_breaker("acquirer").state.name == "CLOSED"


def test_reset_of_one_client_key(ops: Any, client: Client) -> None:
    for _ in range(3):
        _use_key(client, "a")
        _use_key(client, "b")
    response = client.post(
        BASE + "per_ip/reset", data=json.dumps({"key": "a"}), content_type="application/json", **_bearer()
    )
    assert response.status_code == 200
    assert get_rate_limiter("per_ip", key="a").metrics.available_permissions == 3
    assert get_rate_limiter("per_ip", key="b").metrics.available_permissions == 0


@pytest.mark.parametrize(
    ("body", "content_type", "fragment"),
    [
        (json.dumps({"key": ""}), "application/json", "'key' is empty"),
        ("key=", "application/x-www-form-urlencoded", "'key' is empty"),
        (json.dumps({"kye": "a"}), "application/json", "unknown field 'kye'"),
        ("key=a", "text/plain", "unsupported content type 'text/plain'"),
    ],
)
@pytest.mark.parametrize("action", ["reset", "drain"])
def test_a_malformed_key_is_refused_never_widened_to_every_client(
    ops: Any, client: Client, action: str, body: str, content_type: str, fragment: str
) -> None:
    for _ in range(3):
        _use_key(client, "a")
    response = client.post(BASE + f"per_ip/{action}", data=body, content_type=content_type, **_bearer())
    assert response.status_code == 400 and fragment in response.json()["error"]
    assert get_rate_limiter("per_ip", key="a").metrics.available_permissions == 0  # nothing was reset


@pytest.mark.parametrize(
    ("path", "body", "status", "fragment"),
    [
        ("nope/reset", {}, 404, "no ratelimiter or circuitbreaker"),
        ("acquirer/transition", {}, 400, "'to' is required"),
        ("acquirer/transition", {"to": "SIDEWAYS"}, 400, "unknown circuit breaker state"),
        ("api/transition", {"to": "OPEN"}, 400, "applies to circuitbreaker"),
        ("acquirer/reset", {}, 400, "name one: circuitbreaker:acquirer"),
        ("bulkhead:acquirer/reset", {}, 400, "applies to"),
        ("acquirer/drain", {}, 400, "drain applies to ratelimiter"),
    ],
)
def test_action_errors_are_clear(
    ops: Any, client: Client, path: str, body: dict[str, Any], status: int, fragment: str
) -> None:
    response = client.post(BASE + path, data=json.dumps(body), content_type="application/json", **_bearer())
    assert response.status_code == status
    assert fragment in response.json()["error"]


def test_illegal_transition_is_a_400(ops: Any, client: Client) -> None:
    get_circuit_breaker("acquirer").transition_to_metrics_only_state()
    response = client.post(BASE + "acquirer/transition", data={"to": "HALF_OPEN"}, **_bearer())
    assert response.status_code == 400
    assert "METRICS_ONLY -> HALF_OPEN" in response.json()["error"]
    assert get_circuit_breaker("acquirer").state.name == "METRICS_ONLY"


def test_bad_json_body_and_wrong_method(ops: Any, client: Client) -> None:
    bad = client.post(BASE + "slow/drain", data="{", content_type="application/json", **_bearer())
    assert bad.status_code == 400 and "not valid JSON" in bad.json()["error"]
    deep = client.post(BASE + "slow/drain", data="[" * 100_000, content_type="application/json", **_bearer())
    assert deep.status_code == 400 and "not valid JSON" in deep.json()["error"]
    assert client.get(BASE + "slow/drain", **_bearer()).status_code == 405
    assert client.post(BASE, **_bearer()).status_code == 405


def test_staff_posts_keep_csrf_protection(ops: Any, db: Any) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(_user(db, is_staff=True))
    assert client.post(BASE + "slow/drain").status_code == 403
    assert get_rate_limiter("slow").metrics.available_permissions == 10
    # With the token Django's CSRF middleware expects (cookie + header), the staff POST works.
    client.get(BASE)  # any response: make sure a session exists
    from django.middleware.csrf import _get_new_csrf_string, _mask_cipher_secret

    secret = _get_new_csrf_string()
    client.cookies[django_settings.CSRF_COOKIE_NAME] = secret
    ok = client.post(BASE + "slow/drain", HTTP_X_CSRFTOKEN=_mask_cipher_secret(secret))
    assert ok.status_code == 200 and ok.json()["drained"] == 10
    # A bearer-token POST needs no CSRF token at all.
    assert Client(enforce_csrf_checks=True).post(BASE + "slow/reset", **_bearer()).status_code == 200


# ------------------------------------------------------------------------- r4 --url against a server


@pytest.fixture(scope="session")
def _static_url() -> Any:
    """pytest-django's live server serves STATIC_URL, and crashes on every request when it is unset
    (tests.settings has no staticfiles). Must be set before the session's live server starts."""
    from django.test.utils import override_settings

    with override_settings(STATIC_URL=getattr(django_settings, "STATIC_URL", None) or "/static/"):
        yield


@pytest.fixture
def server(_static_url: Any, live_server: Any) -> str:
    """The state endpoint's URL on the live server."""
    return live_server.url + BASE


def _r4(*args: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    call_command("r4", *args, stdout=out, stderr=err)
    assert "in-memory" not in err.getvalue()  # remote mode does not warn about local state
    return out.getvalue()


def test_seed_status_json_over_url_after_11_calls(ops: Any, server: str) -> None:
    """The seed: after 11 calls to a 10-per-second view, ``r4 status --json`` shows 0 available."""
    import urllib.error
    import urllib.request

    statuses = []
    for _ in range(11):
        try:
            with urllib.request.urlopen(server.replace(BASE, "/limited"), timeout=10) as response:
                statuses.append(response.status)
        except urllib.error.HTTPError as exc:
            statuses.append(exc.code)
    assert statuses == [200] * 10 + [429]

    items = json.loads(_r4("status", "--json", "--url", server, "--token", TOKEN))
    api = _by(items, "ratelimiter", "api")
    assert api["state"]["available_permissions"] == 0
    assert (api["state"]["successful_calls"], api["state"]["failed_calls"]) == (10, 1)
    only = json.loads(_r4("status", "api", "--json", "--url", server, "--token", TOKEN))
    assert [i["name"] for i in only] == ["api"]
    table = _r4("status", "--url", server, "--token", TOKEN)
    assert "Rate limiters" in table and "10/1s" in table


def test_actions_over_url(ops: Any, server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    url = server
    monkeypatch.setenv("R4_STATE_ENDPOINT_TOKEN", TOKEN)
    assert "drained 10" in _r4("drain", "slow", "--url", url)
    assert get_rate_limiter("slow").metrics.available_permissions == 0
    assert "CLOSED -> OPEN" in _r4("transition", "circuitbreaker:acquirer", "--to", "open", "--url", url)
    assert get_circuit_breaker("acquirer").state.name == "OPEN"
    assert "reset" in _r4("reset", "circuitbreaker:acquirer", "--url", url)
    assert get_circuit_breaker("acquirer").state.name == "CLOSED"
    with pytest.raises(CommandError, match="name one"):
        _r4("reset", "acquirer", "--url", url)


def test_url_mode_errors(ops: Any, server: str) -> None:
    url = server
    with pytest.raises(CommandError, match="token was refused"):
        _r4("status", "--url", url, "--token", "wrong")
    with pytest.raises(CommandError, match=r"no ratelimiter named .nope."):
        _r4("drain", "nope", "--url", url, "--token", TOKEN)
    with pytest.raises(CommandError, match=r"did not answer with JSON|answered 404"):
        _r4("status", "--url", server.replace(BASE, "/limited"), "--token", TOKEN)
    with pytest.raises(CommandError, match="cannot reach"):
        _r4("status", "--url", "http://127.0.0.1:9/ops/r4/", "--token", TOKEN)


# ------------------------------------------------- a body that mentions `key` names exactly one client


def _multipart(*parts: tuple[str, str, str | None]) -> tuple[bytes, str]:
    """A raw multipart body of ``(name, value, filename or None)`` parts, and its content type."""
    chunks = []
    for name, value, filename in parts:
        disposition = f'form-data; name="{name}"' + ("" if filename is None else f'; filename="{filename}"')
        chunks.append(f"--B\r\nContent-Disposition: {disposition}\r\n\r\n{value}\r\n")
    return ("".join(chunks) + "--B--\r\n").encode(), "multipart/form-data; boundary=B"


_WIDENING = [
    pytest.param('{"key": "a", "key": null}', "application/json", "more than once", id="json-dup-then-null"),
    pytest.param('{"key": null, "key": "a"}', "application/json", "more than once", id="json-null-then-dup"),
    pytest.param('{"key": "a", "key": "b"}', "application/json", "more than once", id="json-two-keys"),
    pytest.param('{"key": null}', "application/json", "must be a non-empty string", id="json-null"),
    pytest.param('{"key": ["a"]}', "application/json", "must be a non-empty string", id="json-list"),
    pytest.param("key=a&key=b", "application/x-www-form-urlencoded", "2 times", id="form-two-keys"),
    pytest.param(*_multipart(("key", "a", "k.txt")), "file part", id="multipart-key-as-file"),
    pytest.param(*_multipart(("key", "a", "..")), "not a plain named form field", id="multipart-key-dotdot"),
    pytest.param(*_multipart(("key", "a", None), ("key", "b", None)), "2 times", id="multipart-two-keys"),
    pytest.param(
        *_multipart(("key", "a", None), ("x", "b", "f.txt")), "file part", id="multipart-key-plus-file"
    ),
]


@pytest.mark.parametrize(("body", "content_type", "fragment"), _WIDENING)
@pytest.mark.parametrize("action", ["reset", "drain"])
def test_a_key_that_is_not_exactly_one_string_is_a_400_never_every_client(
    ops: Any, client: Client, action: str, body: Any, content_type: str, fragment: str
) -> None:
    for _ in range(3):
        _use_key(client, "a")
        _use_key(client, "b")
    response = client.post(BASE + f"per_ip/{action}", data=body, content_type=content_type, **_bearer())
    assert response.status_code == 400, response.content
    assert fragment in response.json()["error"]
    assert get_rate_limiter("per_ip", key="a").metrics.available_permissions == 0  # nothing was reset
    assert get_rate_limiter("per_ip", key="b").metrics.available_permissions == 0


@pytest.mark.parametrize("body", ["", "{}", '{"key": "a"}'], ids=["empty", "json-empty", "json-key"])
def test_a_key_in_the_query_string_is_refused_not_ignored(ops: Any, client: Client, body: str) -> None:
    for _ in range(3):
        _use_key(client, "a")
        _use_key(client, "b")
    response = client.post(
        BASE + "per_ip/reset?key=b", data=body, content_type="application/json", **_bearer()
    )
    assert response.status_code == 400 and "query string" in response.json()["error"]
    assert get_rate_limiter("per_ip", key="a").metrics.available_permissions == 0
    assert get_rate_limiter("per_ip", key="b").metrics.available_permissions == 0


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        ('{"key": "a"}', "application/json"),
        ("key=a", "application/x-www-form-urlencoded"),
        _multipart(("key", "a", None)),
    ],
    ids=["json", "form", "multipart"],
)
def test_one_key_in_any_body_resets_that_client_alone(
    ops: Any, client: Client, body: Any, content_type: str
) -> None:
    for _ in range(3):
        _use_key(client, "a")
        _use_key(client, "b")
    response = client.post(BASE + "per_ip/reset", data=body, content_type=content_type, **_bearer())
    assert response.status_code == 200 and response.json()["key"] == "a"
    assert get_rate_limiter("per_ip", key="a").metrics.available_permissions == 3
    assert get_rate_limiter("per_ip", key="b").metrics.available_permissions == 0


def test_a_body_without_key_still_acts_on_the_whole_instance(ops: Any, client: Client) -> None:
    for _ in range(3):
        _use_key(client, "a")
        _use_key(client, "b")
    body, content_type = _multipart()
    response = client.post(BASE + "per_ip/reset", data=body, content_type=content_type, **_bearer())
    assert response.status_code == 200 and "key" not in response.json()
    assert get_rate_limiter("per_ip", key="a").metrics.available_permissions == 3
    assert get_rate_limiter("per_ip", key="b").metrics.available_permissions == 3


def test_staff_multipart_post_with_the_csrf_field_is_read(ops: Any, db: Any) -> None:
    """The CSRF check parses the form before the action does: the body must still be readable."""
    from django.middleware.csrf import _get_new_csrf_string, _mask_cipher_secret

    client = Client(enforce_csrf_checks=True)
    client.force_login(_user(db, is_staff=True))
    for _ in range(3):
        _use_key(client, "a")
        _use_key(client, "b")
    secret = _get_new_csrf_string()
    client.cookies[django_settings.CSRF_COOKIE_NAME] = secret
    body, content_type = _multipart(
        ("csrfmiddlewaretoken", _mask_cipher_secret(secret), None), ("key", "a", None)
    )
    response = client.post(BASE + "per_ip/reset", data=body, content_type=content_type)
    assert response.status_code == 400 and "unknown field 'csrfmiddlewaretoken'" in response.json()["error"]


# ------------------------------------------------------- the 404 never names the endpoint, DEBUG or not


_REFUSED = [
    pytest.param("get", BASE, {}, id="anonymous-get"),
    pytest.param("post", BASE + "per_ip/reset", {}, id="anonymous-post"),
    pytest.param("get", BASE + "?keys=1", {"HTTP_AUTHORIZATION": "Bearer nope"}, id="wrong-token"),
    pytest.param(
        "post", BASE + "acquirer/transition", {"HTTP_AUTHORIZATION": "Bearer nope"}, id="wrong-token-post"
    ),
]


@pytest.mark.parametrize(("method", "path", "meta"), _REFUSED)
@pytest.mark.parametrize("debug", [True, False], ids=["DEBUG", "production"])
def test_a_refused_caller_gets_the_404_of_a_missing_page_even_with_debug(
    ops: Any, client: Client, settings: Any, method: str, path: str, meta: dict[str, str], debug: bool
) -> None:
    settings.DEBUG = debug
    refused = getattr(client, method)(path, **meta)
    assert refused.status_code == 404
    body = refused.content.decode()
    for leak in (
        "state_view",
        "reset_view",
        "transition_view",
        "django_ratelimit_r4",
        "ratelimit_r4",
        "Raised by",
    ):
        assert leak not in body, leak
    # Exactly what production answers for a URL that does not exist: same body, same headers.
    settings.DEBUG = False
    missing = client.get("/no-such-page/")
    assert missing.status_code == 404
    assert refused.content == missing.content
    # Vary: Cookie is the one difference: looking for a staff session reads the session, and a cache
    # must not serve this 404 to a staff user's request.
    assert {k: v for k, v in refused.headers.items() if k != "Vary"} == dict(missing.headers)
