"""Per-client keys an attacker cannot steer (issue 8, items 2, 3 and 4), through Django's test client.

Each view here is rate limited by one named instance with ``limit_for_period`` 2 per second, so the
third request of one client in one second is a 429; a forged input that bought a fresh budget would
answer 200 instead.
"""

from __future__ import annotations

import copy
import io
from typing import Any

import pytest
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.test import Client, override_settings
from django.urls import include, path

from django_ratelimit_r4 import conf
from django_ratelimit_r4.checks import check_settings
from django_ratelimit_r4.decorators import ratelimit

pytestmark = pytest.mark.django_db(databases=[])


@ratelimit("per_ip")
def per_ip(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


# One instance ("shared"), several key kinds: each decorator keys the same store its own way.
@ratelimit("shared")
def shared_by_ip(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit("shared", key="header:X-Api-Key")
def shared_by_header(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit("shared", key="user")
def shared_by_user(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit("shared", key="user_or_ip")
def shared_by_user_or_ip(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


def tenant(request: HttpRequest) -> str | None:
    """A custom key function: the ``tenant`` query parameter."""
    return request.GET.get("tenant")


@ratelimit("shared", key="tests.test_keys_security.tenant")
def shared_by_tenant(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit("per_session")
def per_session(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit("per_session")
def per_session_reads(request: HttpRequest) -> HttpResponse:
    return HttpResponse(str(request.session.get("cart")))


@ratelimit("per_session")
async def per_session_async(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit("shared", key="user")
async def shared_by_user_async(request: HttpRequest) -> HttpResponse:
    return HttpResponse(str(request.user.pk))  # the user the key read, with no second query


@ratelimit("shared", key="user_or_ip")
async def shared_by_user_or_ip_async(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


def username(request: HttpRequest) -> str | None:
    """A custom key reading ``request.user``: ``reads_user`` asks async views to load it off the loop first."""
    return request.user.get_username() or None


username.reads_user = True  # type: ignore[attr-defined]


@ratelimit("shared", key="tests.test_keys_security.username")
async def shared_by_username_async(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [
    path("shared/user-async/", shared_by_user_async),
    path("shared/user-or-ip-async/", shared_by_user_or_ip_async),
    path("shared/username-async/", shared_by_username_async),
    path("per-ip/", per_ip),
    path("per-session/", per_session),
    path("per-session-async/", per_session_async),
    path("per-session-reads/", per_session_reads),
    path("shared/ip/", shared_by_ip),
    path("shared/header/", shared_by_header),
    path("shared/user/", shared_by_user),
    path("shared/user-or-ip/", shared_by_user_or_ip),
    path("shared/tenant/", shared_by_tenant),
]


def r4(**top: Any) -> dict[str, Any]:
    """The suite's RATELIMIT_R4 plus this file's instances and top-level options."""
    value = copy.deepcopy(settings.RATELIMIT_R4)
    value["ratelimiters"]["instances"].update(
        {
            "per_ip": {"limit_for_period": 2, "key": "ip"},
            "shared": {"limit_for_period": 2, "key": "ip"},
            "per_session": {"limit_for_period": 2, "key": "session"},
        }
    )
    value.update(top)
    return value


def app(**top: Any) -> Any:
    return override_settings(ROOT_URLCONF=__name__, RATELIMIT_R4=r4(**top))


def statuses(path_: str, forged: list[str], **extra: Any) -> list[int]:
    client = Client()
    return [client.get(path_, HTTP_X_FORWARDED_FOR=xff, **extra).status_code for xff in forged]


# ------------------------------------------------------------- item 4: a peer without an address (unix socket)

FORGED = ["198.51.100.1", "198.51.100.2", "198.51.100.3"]


@pytest.mark.parametrize("remote", ["", None, "/run/gunicorn.sock", "unix:"])
def test_cidr_proxies_do_not_trust_a_peer_without_an_ip_address(r4_clock, remote: str | None) -> None:
    # gunicorn on a Unix socket gives REMOTE_ADDR "" (uvicorn --uds none): not a trusted proxy, so a forged
    # X-Forwarded-For is ignored and every such request shares one budget.
    with app(trusted_proxies=["10.0.0.0/8"]):
        assert statuses("/per-ip/", FORGED, REMOTE_ADDR=remote) == [200, 200, 429]


def test_unix_in_trusted_proxies_trusts_a_unix_socket_peer(r4_clock) -> None:
    # The operator says the only peer on the socket is the proxy: its header names the client.
    with app(trusted_proxies=["unix"]):
        assert statuses("/per-ip/", FORGED, REMOTE_ADDR="") == [200, 200, 200]
        assert statuses("/per-ip/", ["198.51.100.1"] * 2, REMOTE_ADDR="") == [200, 429]
        # An IP peer is not named by "unix": its header is ignored, it is keyed by its own address.
        assert statuses("/per-ip/", FORGED, REMOTE_ADDR="192.0.2.1") == [200, 200, 429]


def test_unix_mixes_with_cidrs(r4_clock) -> None:
    with app(trusted_proxies=["10.0.0.0/8", "unix"]):
        assert statuses("/per-ip/", ["198.51.100.9"] * 2, REMOTE_ADDR="") == [200, 200]
        # the same client through the TCP proxy shares its budget
        assert statuses("/per-ip/", ["198.51.100.9"], REMOTE_ADDR="10.1.2.3") == [429]


def problems(**top: Any) -> list[Any]:
    with override_settings(RATELIMIT_R4=r4(**top)):
        return [m for m in check_settings() if m.id != "ratelimit_r4.W001"]


def test_unix_is_a_valid_trusted_proxies_entry_and_typos_are_check_errors() -> None:
    assert problems(trusted_proxies=["unix", "10.0.0.0/8"]) == []
    found = problems(trusted_proxies=["unx"])
    assert [p.id for p in found] == ["ratelimit_r4.E014"]
    assert "'unix'" in (found[0].hint or "")
    with override_settings(RATELIMIT_R4={"trusted_proxies": ["UNIX"]}):
        assert "unix" in conf.get_options().trusted_proxies  # type: ignore[operator]


# ------------------------------------------------------------------------ item 3: key kinds never collide

IP = "203.0.113.7"


def get(client: Client, path_: str, n: int = 1, **extra: Any) -> list[int]:
    return [client.get(path_, **extra).status_code for _ in range(n)]


def test_a_header_value_equal_to_an_ip_does_not_drain_that_ip(r4_clock) -> None:
    with app():
        client = Client()
        assert get(client, "/shared/header/", 3, HTTP_X_API_KEY=IP, REMOTE_ADDR="192.0.2.1") == [200, 200, 429]
        assert get(client, "/shared/ip/", 3, REMOTE_ADDR=IP) == [200, 200, 429]


def test_a_custom_key_equal_to_an_ip_or_a_header_does_not_share_their_budget(r4_clock) -> None:
    with app():
        client = Client()
        assert get(client, f"/shared/tenant/?tenant={IP}", 2, REMOTE_ADDR="192.0.2.1") == [200, 200]
        assert get(client, "/shared/tenant/?tenant=ip:" + IP, 2, REMOTE_ADDR="192.0.2.1") == [200, 200]
        assert get(client, "/shared/ip/", 2, REMOTE_ADDR=IP) == [200, 200]
        assert get(client, "/shared/header/", 2, HTTP_X_API_KEY="ip:" + IP, REMOTE_ADDR="192.0.2.1") == [200, 200]


@pytest.mark.django_db
def test_a_header_value_equal_to_a_user_pk_does_not_drain_that_user(r4_clock) -> None:
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_user(username="alice", password="pw")
    with app():
        attacker = Client()
        pk = str(user.pk)
        assert get(attacker, "/shared/header/", 3, HTTP_X_API_KEY=pk) == [200, 200, 429]
        assert get(attacker, "/shared/header/", 1, HTTP_X_API_KEY="user:" + pk) == [200]
        alice = Client()
        alice.force_login(user)
        assert get(alice, "/shared/user/", 2) == [200, 200]
        # user_or_ip keys a signed-in user as the user: the same client as key="user", so the same budget.
        assert get(alice, "/shared/user-or-ip/", 1) == [429]


@pytest.mark.django_db
def test_user_or_ip_keeps_users_and_addresses_apart(r4_clock) -> None:
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_user(username="bob", password="pw")
    with app():
        anonymous = Client()
        # An anonymous client is keyed as its IP: the same budget as key="ip" for that address.
        assert get(anonymous, "/shared/user-or-ip/", 2, REMOTE_ADDR=IP) == [200, 200]
        assert get(anonymous, "/shared/ip/", 1, REMOTE_ADDR=IP) == [429]
        bob = Client()
        bob.force_login(user)
        assert get(bob, "/shared/user-or-ip/", 2, REMOTE_ADDR=IP) == [200, 200]
        assert get(Client(), "/shared/header/", 1, HTTP_X_API_KEY=str(user.pk)) == [200]


def test_stored_keys_are_namespaced_and_operators_use_that_form(r4_clock) -> None:
    from django.core.management import call_command

    from django_ratelimit_r4 import get_rate_limiter, state
    from django_ratelimit_r4.keys import key_namespace

    with app():
        client = Client()
        get(client, "/shared/ip/", 2, REMOTE_ADDR=IP)
        get(client, "/shared/header/", 2, HTTP_X_API_KEY=IP)
        get(client, f"/shared/tenant/?tenant={IP}", 2)
        listed = set(state.snapshot(["shared"], include_keys=True)[0]["state"]["keyed"]["keys"])
        assert listed == {
            f"ip:{IP}",
            f"header:x-api-key:{IP}",
            f"tests.test_keys_security.tenant:{IP}",
        }
        assert key_namespace("header:X-Api-Key") == "header:x-api-key:"
        assert key_namespace("tests.test_keys_security.tenant") == "tests.test_keys_security.tenant:"
        assert key_namespace(tenant) == "tests.test_keys_security.tenant:"
        out = io.StringIO()
        call_command("r4", "status", "shared", "--keys", stdout=out)
        assert f"ip:{IP}: 0 available" in out.getvalue()
        assert f"header:x-api-key:{IP}: 0 available" in out.getvalue()
        # r4 reset NAME --key takes the stored (namespaced) key: only that client is refilled.
        call_command("r4", "reset", "shared", "--key", f"ip:{IP}", stdout=io.StringIO())
        assert get(client, "/shared/ip/", 1, REMOTE_ADDR=IP) == [200]
        assert get(client, "/shared/header/", 1, HTTP_X_API_KEY=IP) == [429]
        # The raw value names no stored key: nothing is reset.
        call_command("r4", "reset", "shared", "--key", IP, stdout=io.StringIO())
        assert get(client, "/shared/ip/", 2, REMOTE_ADDR=IP) == [200, 429]
        assert get_rate_limiter("shared", key=f"header:x-api-key:{IP}").metrics.available_permissions == 0


def test_the_state_endpoint_key_actions_take_the_namespaced_key(r4_clock) -> None:
    from django_ratelimit_r4 import get_rate_limiter

    token = "t0ken-" + "x" * 40
    urls = type("URLs", (), {"urlpatterns": [*urlpatterns, path("ops/r4/", include("django_ratelimit_r4.urls"))]})
    with override_settings(ROOT_URLCONF=urls, RATELIMIT_R4=r4(state_endpoint_token=token)):
        client = Client()
        bearer = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
        get(client, "/shared/header/", 2, HTTP_X_API_KEY="k1")
        listed = client.get("/ops/r4/?name=shared&keys=1", **bearer).json()[0]["state"]["keyed"]["keys"]
        assert list(listed) == ["header:x-api-key:k1"]
        response = client.post(
            "/ops/r4/shared/reset", {"key": "header:x-api-key:k1"}, content_type="application/json", **bearer
        )
        assert response.status_code == 200
        assert get(client, "/shared/header/", 1, HTTP_X_API_KEY="k1") == [200]
        response = client.post(
            "/ops/r4/shared/drain", {"key": "header:x-api-key:k1"}, content_type="application/json", **bearer
        )
        assert response.status_code == 200
        assert get_rate_limiter("shared", key="header:x-api-key:k1").metrics.available_permissions == 0
        assert get(client, "/shared/header/", 1, HTTP_X_API_KEY="k1") == [429]


def test_the_ratelimit_pk_is_the_salted_hash_of_the_namespaced_key(r4_clock) -> None:
    from django_ratelimit_r4.decorators import _secret_salt
    from django_ratelimit_r4.headers import partition_key

    with app():
        client = Client()
        by_ip = client.get("/shared/ip/", REMOTE_ADDR=IP)
        by_header = client.get("/shared/header/", HTTP_X_API_KEY=IP)
    assert by_ip["RateLimit"] == f'"shared";r=1;t=1;pk={partition_key("ip:" + IP, _secret_salt())}'
    assert by_header["RateLimit"].endswith(f";pk={partition_key('header:x-api-key:' + IP, _secret_salt())}")


# ------------------------------------------------------ item 2: a session the store does not know is an IP

ENGINES = [
    "django.contrib.sessions.backends.db",
    "django.contrib.sessions.backends.cache",
    "django.contrib.sessions.backends.signed_cookies",
]


def real_session(client: Client) -> str:
    """Create a session in the configured store (as a login would) and give its cookie to ``client``."""
    from importlib import import_module

    store = import_module(settings.SESSION_ENGINE).SessionStore()
    store["cart"] = [id(client)]  # distinct data: a signed-cookie session's key is its signed data
    store.save()
    client.cookies[settings.SESSION_COOKIE_NAME] = store.session_key
    return str(store.session_key)


def with_cookie(value: str) -> Client:
    client = Client()
    client.cookies[settings.SESSION_COOKIE_NAME] = value
    return client


@pytest.mark.django_db
@pytest.mark.parametrize("engine", ENGINES)
def test_no_session_cookie_is_keyed_by_ip_not_unlimited(r4_clock, engine: str) -> None:
    with app(), override_settings(SESSION_ENGINE=engine):
        assert get(Client(), "/per-session/", 3, REMOTE_ADDR=IP) == [200, 200, 429]
        assert get(Client(), "/per-session/", 1, REMOTE_ADDR="192.0.2.1") == [200]


@pytest.mark.django_db
@pytest.mark.parametrize("engine", ENGINES)
def test_made_up_session_ids_share_the_ip_budget(r4_clock, engine: str) -> None:
    with app(), override_settings(SESSION_ENGINE=engine):
        forged = [f"madeup{n:04d}" + "x" * 20 for n in range(3)]
        codes = [get(with_cookie(value), "/per-session/", 1, REMOTE_ADDR=IP)[0] for value in forged]
        assert codes == [200, 200, 429]
        # ... the same budget as a client sending no cookie from that address
        assert get(Client(), "/per-session/", 1, REMOTE_ADDR=IP) == [429]


@pytest.mark.django_db
@pytest.mark.parametrize("engine", ENGINES)
def test_a_known_session_has_its_own_budget(r4_clock, engine: str) -> None:
    from django_ratelimit_r4 import get_rate_limiter

    with app(), override_settings(SESSION_ENGINE=engine):
        alice, bob = Client(), Client()
        alice_key = real_session(alice)
        real_session(bob)
        assert get(alice, "/per-session/", 3, REMOTE_ADDR=IP) == [200, 200, 429]
        assert get(bob, "/per-session/", 2, REMOTE_ADDR=IP) == [200, 200]  # same address, own session
        assert get(Client(), "/per-session/", 2, REMOTE_ADDR=IP) == [200, 200]  # the address's own budget
        stored = get_rate_limiter("per_session", key="session:" + alice_key)
        assert stored.metrics.available_permissions == 0


@pytest.mark.django_db
def test_the_db_engine_costs_one_query_per_request_with_a_cookie_shared_with_the_view(
    r4_clock, django_assert_num_queries: Any
) -> None:
    with app():
        with django_assert_num_queries(0):  # no cookie: the store is not read
            assert get(Client(), "/per-session/", 1, REMOTE_ADDR=IP) == [200]
        client = Client()
        real_session(client)
        with django_assert_num_queries(1):  # the key's read of the session ...
            assert get(client, "/per-session/", 1) == [200]
        with django_assert_num_queries(1):  # ... is the read the view makes anyway
            response = client.get("/per-session-reads/")
        assert response.status_code == 200 and response.content == str([id(client)]).encode()
        with django_assert_num_queries(1):  # a made-up id: one query finds nothing, the IP decides
            assert get(with_cookie("q" * 32), "/per-session/", 1) == [200]


@pytest.mark.django_db
def test_a_session_through_trusted_proxies_falls_back_to_the_resolved_client(r4_clock) -> None:
    with app(trusted_proxies=1):
        proxy = {"REMOTE_ADDR": "10.0.0.1"}
        assert get(Client(), "/per-session/", 2, HTTP_X_FORWARDED_FOR=IP, **proxy) == [200, 200]
        assert get(with_cookie("f" * 32), "/per-session/", 1, HTTP_X_FORWARDED_FOR=IP, **proxy) == [429]
        assert get(Client(), "/per-session/", 1, HTTP_X_FORWARDED_FOR="192.0.2.9", **proxy) == [200]


@pytest.mark.django_db(transaction=True)
async def test_async_views_key_by_the_session_without_blocking_the_loop(r4_clock) -> None:
    from asgiref.sync import sync_to_async
    from django.test import AsyncClient

    with app():
        alice = AsyncClient()
        key = await sync_to_async(real_session)(alice)  # type: ignore[arg-type]
        assert key
        codes = [(await alice.get("/per-session-async/", REMOTE_ADDR=IP)).status_code for _ in range(3)]
        assert codes == [200, 200, 429]
        # No cookie, then a made-up one, from one address: one budget, the address's.
        codes = [(await AsyncClient().get("/per-session-async/", REMOTE_ADDR=IP)).status_code for _ in range(2)]
        assert codes == [200, 200]
        forged = AsyncClient()
        forged.cookies[settings.SESSION_COOKIE_NAME] = "z" * 32
        assert (await forged.get("/per-session-async/", REMOTE_ADDR=IP)).status_code == 429


@pytest.mark.django_db(transaction=True)
async def test_async_views_key_by_the_signed_in_user(r4_clock, django_assert_num_queries) -> None:
    """``request.user`` is a lazy object whose first read queries the database: read by the "user" key of an async
    view, Django refused that query on the event loop (SynchronousOnlyOperation, a 500 for every signed-in
    request). The gate loads it with ``request.auser()`` first, and the view reads the same user for free."""
    from asgiref.sync import sync_to_async
    from django.contrib.auth import get_user_model
    from django.test import AsyncClient

    user = await sync_to_async(get_user_model().objects.create_user)(username="carol", password="pw")
    with app():
        carol = AsyncClient()
        await carol.aforce_login(user)
        responses = [await carol.get("/shared/user-async/", REMOTE_ADDR=IP) for _ in range(3)]
        assert [r.status_code for r in responses] == [200, 200, 429]
        assert responses[0].content == str(user.pk).encode()
        # user_or_ip: the same budget (the user's), whatever the address.
        assert (await carol.get("/shared/user-or-ip-async/", REMOTE_ADDR="192.0.2.77")).status_code == 429
        # Anonymous, no cookie: "user" exempts, user_or_ip keys the address.
        anonymous = AsyncClient()
        codes = [(await anonymous.get("/shared/user-async/", REMOTE_ADDR=IP)).status_code for _ in range(3)]
        assert codes == [200, 200, 200]
        codes = [(await anonymous.get("/shared/user-or-ip-async/", REMOTE_ADDR=IP)).status_code for _ in range(3)]
        assert codes == [200, 200, 429]
        # A custom key marked reads_user is served the same way.
        dave = AsyncClient()
        other = await sync_to_async(get_user_model().objects.create_user)(username="dave", password="pw")
        await dave.aforce_login(other)
        codes = [(await dave.get("/shared/username-async/", REMOTE_ADDR=IP)).status_code for _ in range(3)]
        assert codes == [200, 200, 429]


@pytest.mark.django_db(transaction=True)
def test_a_sync_view_keyed_by_user_queries_the_user_once(r4_clock, django_assert_num_queries) -> None:
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_user(username="erin", password="pw")
    with app():
        erin = Client()
        erin.force_login(user)
        with django_assert_num_queries(2):  # the session, then the user: the key's reads, nothing more
            assert get(erin, "/shared/user/", 1) == [200]


# ------------------------------------------------------------------------------------ item 8: safe defaults


def test_one_ipv6_64_is_one_client_by_default(r4_clock) -> None:
    assert "ipv6_prefix_length" not in r4()
    with app():
        client = Client()
        hosts = ["2001:db8:1:2::1", "2001:db8:1:2:aaaa::7", "2001:db8:1:2:ffff:ffff:ffff:ffff"]
        assert [client.get("/per-ip/", REMOTE_ADDR=h).status_code for h in hosts] == [200, 200, 429]
        assert client.get("/per-ip/", REMOTE_ADDR="2001:db8:1:3::1").status_code == 200  # the next /64
    with app(ipv6_prefix_length=128):  # opting out: one budget per address again
        assert [Client().get("/per-ip/", REMOTE_ADDR=h).status_code for h in hosts] == [200, 200, 200]


def test_default_max_keys_keeps_one_keyed_limiter_in_tens_of_mb(r4_clock) -> None:
    import gc
    import tracemalloc

    from django_ratelimit_r4 import registry, state

    with app():
        keyed = registry.get_keyed_rate_limiter("per_ip")
        assert keyed.max_keys == conf.DEFAULT_MAX_KEYS == 100_000
        assert state.snapshot(["per_ip"])[0]["state"]["keyed"]["max_keys"] == 100_000
        n = 20_000
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for i in range(n):  # the keys "ip" stores, built in the traced region as requests would
                keyed.acquire_permission(f"ip:10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}")
            per_key = (tracemalloc.get_traced_memory()[0] - before) / n
        finally:
            tracemalloc.stop()
        assert len(keyed) == n
        # benchmarks/bench_keyed_memory.py measures ~190 B/key (tracemalloc), ~200 B/key of RSS.
        assert per_key * keyed.max_keys < 50_000_000
