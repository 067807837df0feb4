"""Per-client keys an attacker cannot steer (issue 8, items 2, 3 and 4), through Django's test client.

Each view here is rate limited by one named instance with ``limit_for_period`` 2 per second, so the
third request of one client in one second is a 429; a forged input that bought a fresh budget would
answer 200 instead.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.test import Client, override_settings
from django.urls import path

from django_ratelimit_r4 import conf
from django_ratelimit_r4.checks import check_settings
from django_ratelimit_r4.decorators import ratelimit

pytestmark = pytest.mark.django_db(databases=[])


@ratelimit("per_ip")
def per_ip(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [
    path("per-ip/", per_ip),
]


def r4(**top: Any) -> dict[str, Any]:
    """The suite's RATELIMIT_R4 plus this file's instances and top-level options."""
    value = copy.deepcopy(settings.RATELIMIT_R4)
    value["ratelimiters"]["instances"].update(
        {
            "per_ip": {"limit_for_period": 2, "key": "ip"},
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
