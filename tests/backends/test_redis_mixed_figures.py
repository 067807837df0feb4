"""A gate mixing in-memory and Redis limits, refused in memory first (issue 9): the Redis limits are not decided,
and the figures of ALL of them for the 429 are read in one round trip (their state reads pipelined on one
connection), whatever their number, algorithms (cycle, GCRA, sliding window) and keyed-ness; sync, async and DRF.

Round trips are counted on a dedicated ``redis-server`` (the ``redis_server`` fixture) as the read events it
processed (``INFO stats`` ``total_reads_processed``: a pipelined write of several commands is one read), next to
the script calls (``INFO commandstats``, one ``EVALSHA`` per Redis limit). The header fields must be exactly what
separate ``quota()`` reads give.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import AsyncClient, Client, RequestFactory, override_settings
from django.urls import path

from django_ratelimit_r4 import get_rate_limiter, registry
from django_ratelimit_r4.core.clock import SYSTEM_CLOCK
from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig
from django_ratelimit_r4.decorators import RateLimitGate, ratelimit
from django_ratelimit_r4.keyed import KeyedRateLimiter, aacquire_all_quotas, acquire_all_quotas
from tests.backends.drf_views import drf_view

redis = pytest.importorskip("redis")
rb = pytest.importorskip("django_ratelimit_r4.backends.redis")

pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db(databases=[])]

PEER = "203.0.113.9"
ALGORITHMS = ("cycle", "gcra", "sliding_window")
SHORT = {"cycle": "c", "gcra": "g", "sliding_window": "s"}

#: gate name -> its limits: "mem" (in memory, 3 a second) refuses the 4th request first; the Redis limits (10 a
#: minute, unkeyed "r_*" and keyed "k_*") would grant it.
GATES: dict[str, list[str]] = {
    **{f"{SHORT[a]}": ["mem", f"r_{SHORT[a]}", f"k_{SHORT[a]}"] for a in ALGORITHMS},
    # every algorithm at once, keyed in memory, two keyed Redis limits
    "all": ["mem_ip", "r_c", "k_g", "r_s", "k_s"],
}


def _view(names: list[str]) -> Any:
    @ratelimit(names)
    def view(request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")

    return view


def _async_view(names: list[str]) -> Any:
    @ratelimit(names)
    async def view(request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")

    return view


urlpatterns = [
    *(path(f"{gate}/", _view(names)) for gate, names in GATES.items()),
    *(path(f"{gate}-async/", _async_view(names)) for gate, names in GATES.items()),
    *(path(f"{gate}-drf/", drf_view(names)) for gate, names in GATES.items()),
]


def _settings(url: str) -> dict[str, Any]:
    instances: dict[str, Any] = {
        "mem": {"limit_for_period": 3, "limit_refresh_period": "1s", "backend": "local"},
        "mem_ip": {"limit_for_period": 3, "limit_refresh_period": "1s", "backend": "local", "key": "ip"},
    }
    for algorithm in ALGORITHMS:
        instances[f"r_{SHORT[algorithm]}"] = {"limit_for_period": 10, "algorithm": algorithm}
        instances[f"k_{SHORT[algorithm]}"] = {"limit_for_period": 10, "algorithm": algorithm, "key": "ip"}
    return {
        "backend": "redis",
        "redis_url": url,
        "backends": {"local": {"BACKEND": "memory"}},
        "ratelimiters": {
            "configs": {"default": {"limit_refresh_period": "60s", "timeout_duration": "0s"}},
            "instances": instances,
        },
    }


class Counter:
    """What the dedicated server did since the last :meth:`take`: read events (round trips) and script calls."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.take()

    def take(self) -> tuple[int, int]:
        """``(round trips, script calls)`` since the last call, this counter's own commands left out."""
        stats = self.client.info("stats")  # its own read counts: one
        commands = self.client.info("commandstats")  # read after the first INFO: counts once more
        self.client.config_resetstat()
        scripts = sum(int(commands.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))
        return int(stats["total_reads_processed"]) - 1, scripts


@pytest.fixture
def counter(redis_server: Any, r4_clock: Any) -> Iterator[Counter]:
    """Every limiter in the dedicated Redis, built (their reset is a script call) before anything is counted."""
    with override_settings(RATELIMIT_R4=_settings(redis_server.url)):
        for names in GATES.values():
            for name in names:
                if name.startswith("k_") or name == "mem_ip":
                    registry.get_keyed_rate_limiter(name)
                else:
                    get_rate_limiter(name)
        counter = Counter(redis_server.url)
        _load_scripts(counter.client)
        yield counter
        counter.client.close()


def _load_scripts(client: Any) -> None:
    """Every rate-limiter script known to the server before counting (else the first call is EVALSHA + EVAL)."""
    from django_ratelimit_r4.backends.redis_gcra import GCRA
    from django_ratelimit_r4.backends.redis_mixed import MIXED_SCRIPT
    from django_ratelimit_r4.backends.redis_sliding import SLIDING

    for text in (rb.SCRIPT, GCRA.text, SLIDING.text, MIXED_SCRIPT):
        client.script_load(text)


def _separate_reads(names: list[str]) -> dict[str, str]:
    """The header fields as separate ``quota()`` reads give them (one round trip per Redis limit)."""
    gate = RateLimitGate(names)
    request = RequestFactory().get("/", REMOTE_ADDR=PEER)
    return gate.headers(gate._keys(gate.plan(), request))


def _fields(response: Any) -> dict[str, str]:
    return {name: response[name] for name in ("RateLimit-Policy", "RateLimit")}


def _redis_left(names: list[str]) -> list[int]:
    """The permits left in each Redis limit of ``names`` for PEER (keyed ones by the gate's own key)."""
    gate = RateLimitGate(names)
    keys = gate._keys(gate.plan(), RequestFactory().get("/", REMOTE_ADDR=PEER))
    left = []
    for name, key in zip(names, keys, strict=True):
        if name.startswith("k_"):
            left.append(registry.get_keyed_rate_limiter(name).state(key)[1])
        elif name.startswith("r_"):
            left.append(get_rate_limiter(name).metrics.available_permissions)
    return left


def test_the_counter_counts_one_pipelined_write_as_one_round_trip(counter: Counter, redis_server: Any) -> None:
    client = redis.Redis.from_url(redis_server.url)
    client.ping()  # connected before counting
    counter.take()
    pipe = client.pipeline(transaction=False)
    for _ in range(5):
        pipe.get("x")
    pipe.execute()
    assert counter.take() == (1, 0)
    client.get("x")
    client.get("y")
    assert counter.take() == (2, 0)
    client.close()


@pytest.mark.parametrize("gate", list(GATES))
@pytest.mark.parametrize("kind", ["", "-drf"])
def test_refused_in_memory_every_redis_figure_in_one_round_trip_sync(counter: Counter, gate: str, kind: str) -> None:
    names = GATES[gate]
    redis_limits = sum(1 for name in names if name[:2] in ("r_", "k_"))
    client = Client(REMOTE_ADDR=PEER)
    client.get("/nothing-here/")  # Django's first request: nothing of ours, but warms the client
    counter.take()
    statuses = []
    for _ in range(4):
        response = client.get(f"/{gate}{kind}/")
        round_trips, scripts = counter.take()
        statuses.append(response.status_code)
        assert round_trips == 1, response.status_code
        if response.status_code == 429:  # one state read per Redis limit, all in one write
            assert scripts == redis_limits
        assert _fields(response) == _separate_reads(names)
        counter.take()  # the separate reads are not the request's
    assert statuses == [200, 200, 200, 429]
    assert _redis_left(names) == [7] * redis_limits  # the 429 took nothing from Redis


@pytest.mark.parametrize("gate", list(GATES))
async def test_refused_in_memory_every_redis_figure_in_one_round_trip_async(counter: Counter, gate: str) -> None:
    from asgiref.sync import sync_to_async

    class PeerAsyncClient(AsyncClient):
        def _base_scope(self, **request: Any) -> dict[str, Any]:
            scope = super()._base_scope(**request)
            scope["client"] = [PEER, 0]
            return scope

    names = GATES[gate]
    redis_limits = sum(1 for name in names if name[:2] in ("r_", "k_"))
    client = PeerAsyncClient()
    await client.get("/nothing-here/")
    await get_rate_limiter("r_c").backend._connection().aio().ping()  # this loop's pooled connection, opened
    await sync_to_async(counter.take)()
    statuses = []
    for _ in range(4):
        response = await client.get(f"/{gate}-async/")
        round_trips, scripts = await sync_to_async(counter.take)()
        statuses.append(response.status_code)
        assert round_trips == 1, response.status_code
        if response.status_code == 429:  # one state read per Redis limit, all in one write
            assert scripts == redis_limits
        assert _fields(response) == await sync_to_async(_separate_reads)(names)
        await sync_to_async(counter.take)()
    assert statuses == [200, 200, 200, 429]
    assert await sync_to_async(_redis_left)(names) == [7] * redis_limits


# -- keyed.acquire_all_quotas on Redis's own clock (server TIME, deadlines stamped), and under faults -----------


def _limiters(url: str, prefix: str, on_error: str = "allow") -> tuple[RateLimiter, list[tuple[Any, Any]]]:
    """An in-memory limiter (1 a minute) and Redis limiters of every algorithm, unkeyed and keyed, on Redis time."""
    options = {"socket_timeout": 2.0, "socket_connect_timeout": 2.0}
    memory = RateLimiter("mem", RateLimiterConfig(limit_for_period=1, limit_refresh_period="60s"), clock=SYSTEM_CLOCK)
    store = rb.RedisStore("shared", url, {"key_prefix": prefix, **options})
    factory = store.backend_factory(on_error)
    entries: list[tuple[Any, Any]] = []
    for algorithm in ALGORITHMS:
        config = RateLimiterConfig(limit_for_period=5, limit_refresh_period="60s", algorithm=algorithm)
        name = SHORT[algorithm]
        entries.append((RateLimiter(name, config, clock=SYSTEM_CLOCK, backend=factory), None))
        keyed_store = store.keyed_store(
            name + "k", config, clock=SYSTEM_CLOCK, max_keys=1000, idle_timeout_ns=None, on_error=on_error
        )
        entries.append((KeyedRateLimiter(name + "k", config, clock=SYSTEM_CLOCK, store=keyed_store), "client"))
    return memory, entries


def _check_figures(entries: list[tuple[Any, Any]], quotas: list[tuple[int, int]], remaining: int) -> None:
    assert [q[0] for q in quotas] == [remaining] * len(entries)
    assert all(0 < q[1] <= 60 * 10**9 for q in quotas)


def test_acquire_all_quotas_refused_in_memory_reads_redis_in_one_round_trip(redis_server: Any) -> None:
    url, prefix = redis_server.url, "mf"
    memory, remote = _limiters(url, prefix)
    entries = [(memory, None), *remote]
    counter = Counter(url)
    _load_scripts(counter.client)
    conn = rb.connection(url, {"socket_timeout": 2.0, "socket_connect_timeout": 2.0})
    outcome, quotas = acquire_all_quotas(entries, 1)
    assert outcome is None
    _check_figures(remote, quotas[1:], 4)
    counter.take()
    replies = conn.replies
    for _ in range(2):  # the first read may also learn the server time (the deadline was unknown): still one
        outcome, quotas = acquire_all_quotas(entries, 1)
        assert outcome is not None and outcome[0] == 0  # memory said no
        assert counter.take() == (1, len(remote))
        _check_figures(remote, quotas[1:], 4)  # nothing taken from Redis
        assert quotas[0] == memory.backend.quota()[0:1] + quotas[0][1:]
    assert conn.replies - replies == 2
    counter.client.close()


async def test_aacquire_all_quotas_refused_in_memory_reads_redis_in_one_round_trip(redis_server: Any) -> None:
    from asgiref.sync import sync_to_async

    url, prefix = redis_server.url, "mfa"
    memory, remote = _limiters(url, prefix)
    entries = [(memory, None), *remote]
    counter = await sync_to_async(Counter)(url)
    await sync_to_async(_load_scripts)(counter.client)
    outcome, quotas = await aacquire_all_quotas(entries, 1)
    assert outcome is None
    _check_figures(remote, quotas[1:], 4)
    await sync_to_async(counter.take)()
    for _ in range(2):
        outcome, quotas = await aacquire_all_quotas(entries, 1)
        assert outcome is not None and outcome[0] == 0
        assert await sync_to_async(counter.take)() == (1, len(remote))
        _check_figures(remote, quotas[1:], 4)
    counter.client.close()


@pytest.mark.parametrize(("policy", "remaining"), [("open", 5), ("closed", 0)])
def test_refused_in_memory_with_redis_down_the_figures_are_the_fault_policys(
    redis_server: Any, policy: str, remaining: int
) -> None:
    memory, remote = _limiters(redis_server.url, "mfd", {"open": "allow", "closed": "deny"}[policy])
    entries = [(memory, None), *remote]
    assert acquire_all_quotas(entries, 1)[0] is None
    redis_server.stop()
    for _ in range(2):  # the first meets the fault, the second the cool-down
        outcome, quotas = acquire_all_quotas(entries, 1)
        assert outcome is not None and outcome[0] == 0
        assert [q[0] for q in quotas[1:]] == [remaining] * len(remote)
