"""django-ratelimit-r4 side by side with its Python peers, measured in ONE run with ONE methodology.

Peers (the ``bench`` extra: ``pip install -e ".[bench]"``): django-ratelimit 4.x, limits 5.x, pybreaker 1.x,
purgatory 3.x (only for the open-breaker memory check) and DRF's ``SimpleRateThrottle``. A peer that is not
installed gets one "skipped" row instead of its numbers.

Methodology, the same for every subject:

* ``timeit`` loops of a no-argument callable, ``number`` calibrated per subject so one repeat lasts about
  ``MIN_REPEAT_S``; the figure is the best of ``REPEAT`` repeats. The repeats of every subject in a group are
  interleaved (round-robin), so a noisy neighbour on the shared machine hurts all of them alike.
* Backends configured comparably: in-process memory everywhere. Django's ``LocMemCache`` for DRF and
  django-ratelimit, ``limits.storage.MemoryStorage`` for limits, the default ``MemoryBackend`` for ours.
* A state that stays the same from call to call, so the best-of figure means one thing: a denied subject is
  exhausted before timing; a window "with 10000 hits" is held at 10000 live hits by a fake clock that advances
  one hit spacing per call (DRF's supported ``timer`` attribute; for limits' moving window the storage
  module's ``time`` is swapped for the duration of that one group, as limits has no clock hook).
* ``baseline_ns`` is always OURS (the matching row: keyed limiter for keyed peers, closed/open breaker for
  breakers) and ``ratio = ns_per_op / baseline_ns``: how many times our cost the peer's decision takes.

Two checks without timing: memory growth (``tracemalloc``) over 100k rejections by an OPEN breaker, and
over-admission when 20 threads released by one ``threading.Barrier`` race for a 5-per-window limit.

Run: ``python benchmarks/run.py peers`` (or ``make bench-peers``, or ``python benchmarks/bench_peers.py``).
Not a test: the numbers depend on the machine.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import sys
import threading
import time
import timeit
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the checkout importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import django
from django.conf import settings

__all__ = ["run"]

REPEAT = 7
MIN_REPEAT_S = 0.05
WINDOW_HITS = 10_000
REJECTIONS = 100_000
THREADS = 20
RACE_LIMIT = 5
TRIALS = 200
IP = "203.0.113.7"

Row = dict[str, Any]


def _configure() -> None:
    """Settings for a standalone run; under ``run.py`` another module may have configured them already."""
    if not settings.configured:
        settings.configure(
            SECRET_KEY="bench-only",
            DEBUG=False,
            INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "rest_framework"],
            DATABASES={},
            CACHES={"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}},
            LOGGING_CONFIG=None,
            REST_FRAMEWORK={"DEFAULT_AUTHENTICATION_CLASSES": [], "DEFAULT_PERMISSION_CLASSES": []},
        )
    django.setup()


_configure()

from django.core.cache import caches  # noqa: E402
from django.core.cache.backends.locmem import LocMemCache  # noqa: E402
from django.http import HttpRequest  # noqa: E402

from django_ratelimit_r4.core.circuitbreaker import CircuitBreaker, CircuitBreakerConfig  # noqa: E402
from django_ratelimit_r4.core.exceptions import CallNotPermitted  # noqa: E402
from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig  # noqa: E402
from django_ratelimit_r4.keyed import KeyedRateLimiter  # noqa: E402


def _optional(module: str, attr: str | None = None) -> Any:
    """The module (or one of its attributes), or None when that peer is not installed."""
    try:
        loaded = importlib.import_module(module)
    except ImportError:
        return None
    return loaded if attr is None else getattr(loaded, attr)


SimpleRateThrottle: Any = _optional("rest_framework.throttling", "SimpleRateThrottle")
is_ratelimited: Any = _optional("django_ratelimit.core", "is_ratelimited")
limits: Any = _optional("limits")
limits_memory: Any = _optional("limits.storage.memory")
pybreaker: Any = _optional("pybreaker")
SyncCircuitBreakerFactory: Any = _optional("purgatory", "SyncCircuitBreakerFactory")
OpenedState: Any = _optional("purgatory.domain.model", "OpenedState")


# -- measurement ------------------------------------------------------------------------------------------


def _calibrated(fn: Callable[[], Any]) -> tuple[timeit.Timer, int]:
    """A timer for ``fn`` and the loop count that makes one repeat last about ``MIN_REPEAT_S``."""
    timer = timeit.Timer("f()", globals={"f": fn})
    number = 1
    while True:
        elapsed = timer.timeit(number)
        if elapsed >= MIN_REPEAT_S / 10:
            return timer, max(1, int(number * MIN_REPEAT_S / elapsed))
        number *= 10


def _measure(cases: dict[str, Callable[[], Any]], repeat: int = REPEAT) -> dict[str, float]:
    """Best ns per call of every case, the repeats of all cases interleaved."""
    timers = {name: _calibrated(fn) for name, fn in cases.items()}
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(repeat):
        for name, (timer, number) in timers.items():
            best[name] = min(best[name], timer.timeit(number) / number * 1e9)
    return best


def _row(name: str, ns: float | None, base: float | None, info: str) -> Row:
    ratio = None if ns is None or base is None else round(ns / base, 2)
    return {
        "name": name,
        "ns_per_op": None if ns is None else round(ns, 1),
        "baseline_ns": None if base is None else round(base, 1),
        "ratio": ratio,
        "target": info,
    }


def _skipped(peer: str) -> Row:
    return _row(f"{peer}: skipped (not installed)", None, None, "pip install -e '.[bench]'")


def _exhaust(fn: Callable[[], bool]) -> Callable[[], bool]:
    for _ in range(100):
        if not fn():
            return fn
    raise AssertionError("subject never denied")


# -- subjects: ours -----------------------------------------------------------------------------------------


def _ours_keyed(limit: int) -> KeyedRateLimiter:
    return KeyedRateLimiter(
        "bench-peers", RateLimiterConfig(limit_for_period=limit, limit_refresh_period="1h")
    )


def _ours(limit: int) -> RateLimiter:
    return RateLimiter("bench-peers", RateLimiterConfig(limit_for_period=limit, limit_refresh_period="1h"))


# -- subjects: DRF ------------------------------------------------------------------------------------------


class _Ticker:
    """A fake wall clock that moves ``step`` seconds per read: holds a window at a fixed number of live hits."""

    __slots__ = ("step", "t")

    def __init__(self, start: float, step: float) -> None:
        self.t = start
        self.step = step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


def _drf_throttle(
    rate: str, key: str, history: list[float], timer: Callable[[], float]
) -> Callable[[], bool]:
    """``SimpleRateThrottle.allow_request`` on the default LocMemCache with a constant cache key.

    One instance is reused (DRF builds one per request, a cost left out here in DRF's favour).
    """
    assert SimpleRateThrottle is not None

    class Throttle(SimpleRateThrottle):  # type: ignore[misc]
        scope = "bench"

        def get_cache_key(self, request: Any, view: Any) -> str:
            return key

    Throttle.rate = rate
    throttle = Throttle()
    throttle.timer = timer  # DRF's own hook: ``timer = time.time`` is a class attribute
    throttle.cache.set(key, history, throttle.duration)
    request: Any = HttpRequest()
    allow = throttle.allow_request
    return lambda: allow(request, None)


def _drf_cases() -> dict[str, Callable[[], Any]]:
    now = time.time()
    step = 3600 / WINDOW_HITS
    full = [now - i * step for i in range(WINDOW_HITS)]  # newest first, as DRF keeps it
    cases = {
        "drf allowed empty": _drf_throttle("5/s", "peers:drf:empty", [], _Ticker(now, 2.0)),
        "drf allowed 10k": _drf_throttle(f"{2 * WINDOW_HITS}/h", "peers:drf:10k", full, _Ticker(now, step)),
        "drf denied": _drf_throttle("5/h", "peers:drf:denied", [now] * 5, lambda: now),
        "drf denied 10k": _drf_throttle(f"{WINDOW_HITS}/h", "peers:drf:denied10k", list(full), lambda: now),
    }
    assert cases["drf allowed empty"]() and cases["drf allowed 10k"]()
    assert not cases["drf denied"]() and not cases["drf denied 10k"]()
    return cases


# -- subjects: django-ratelimit -----------------------------------------------------------------------------


def _constant_key(group: str, request: HttpRequest) -> str:
    return IP


def _dr_case(group: str, rate: str, key: Any) -> Callable[[], bool]:
    assert is_ratelimited is not None
    request = HttpRequest()
    request.method = "GET"
    request.META["REMOTE_ADDR"] = IP
    # The core call behind @ratelimit(key=..., rate=..., block=True): True means "limited".
    return lambda: not is_ratelimited(request, group=group, key=key, rate=rate, increment=True)


# -- subjects: limits ---------------------------------------------------------------------------------------


class _FakeTimeModule:
    """Stands in for the ``time`` module inside ``limits.storage.memory`` (limits has no clock hook)."""

    def __init__(self, start: float) -> None:
        self.t = start

    def time(self) -> float:
        return self.t


@contextlib.contextmanager
def _limits_fake_time(start: float) -> Iterator[_FakeTimeModule]:
    fake = _FakeTimeModule(start)
    limits_memory.time = fake
    try:
        yield fake
    finally:
        limits_memory.time = time


# -- rate-limit decisions -----------------------------------------------------------------------------------


def _ratelimit_rows() -> list[Row]:
    cases: dict[str, Callable[[], Any]] = {}
    ours_allowed = _ours(10**15).acquire_permission
    ours_denied = _exhaust(_ours(5).acquire_permission)
    keyed_allowed = _ours_keyed(10**15)
    keyed_denied = _ours_keyed(5)
    cases["ours allowed"] = ours_allowed
    cases["ours denied"] = ours_denied
    cases["keyed allowed"] = lambda: keyed_allowed.acquire_permission(IP)
    cases["keyed denied"] = _exhaust(lambda: keyed_denied.acquire_permission(IP))

    if limits is not None:
        storage = limits.storage.MemoryStorage()
        fixed = limits.strategies.FixedWindowRateLimiter(storage)
        moving = limits.strategies.MovingWindowRateLimiter(storage)
        big, five = limits.parse("1000000000/hour"), limits.parse("5/hour")
        cases["limits fixed allowed"] = lambda: fixed.hit(big, "peers", IP)
        cases["limits fixed denied"] = _exhaust(lambda: fixed.hit(five, "peers", IP))
        cases["limits moving denied"] = _exhaust(lambda: moving.hit(five, "peers-moving", IP))
    if SimpleRateThrottle is not None:
        cases.update(_drf_cases())
    if is_ratelimited is not None:
        cases["dr allowed"] = _dr_case("peers.allowed", "1000000000/h", _constant_key)
        cases["dr denied"] = _exhaust(_dr_case("peers.denied", "5/h", _constant_key))
        cases["dr allowed ip"] = _dr_case("peers.ip", "1000000000/h", "ip")

    ns = _measure(cases)
    ka, kd = ns["keyed allowed"], ns["keyed denied"]
    rows = [
        _row(
            "ours RateLimiter.acquire_permission allowed",
            ns["ours allowed"],
            ns["ours allowed"],
            "issue 2 target ~220 ns",
        ),
        _row(
            "ours RateLimiter.acquire_permission denied",
            ns["ours denied"],
            ns["ours denied"],
            "issue 2 target ~220 ns",
        ),
        _row("ours KeyedRateLimiter allowed (1 key)", ka, ka, "baseline of the keyed peers below"),
        _row("ours KeyedRateLimiter denied (1 key)", kd, kd, "baseline of the keyed peers below"),
    ]
    if limits is None:
        rows.append(_skipped("limits"))
    else:
        rows += [
            _row(
                "limits FixedWindow.hit allowed (MemoryStorage)",
                ns["limits fixed allowed"],
                ka,
                "issue 2 quoted 2.05 us",
            ),
            _row("limits FixedWindow.hit denied", ns["limits fixed denied"], kd, "rejected hits still count"),
            _row("limits MovingWindow.hit denied (5/h)", ns["limits moving denied"], kd, ""),
        ]
        rows += _limits_moving_rows()
    if SimpleRateThrottle is None:
        rows.append(_skipped("DRF"))
    else:
        rows += [
            _row(
                "DRF SimpleRateThrottle allowed, empty window",
                ns["drf allowed empty"],
                ka,
                "issue 2 quoted 11.3 us",
            ),
            _row(
                f"DRF SimpleRateThrottle allowed, {WINDOW_HITS} in window",
                ns["drf allowed 10k"],
                ka,
                "issue 2 quoted 226 us",
            ),
            _row("DRF SimpleRateThrottle denied (5/h)", ns["drf denied"], kd, ""),
            _row(f"DRF SimpleRateThrottle denied, {WINDOW_HITS} in window", ns["drf denied 10k"], kd, ""),
        ]
    if is_ratelimited is None:
        rows.append(_skipped("django-ratelimit"))
    else:
        rows += [
            _row(
                "django-ratelimit is_ratelimited allowed (LocMem)",
                ns["dr allowed"],
                ka,
                "issue 2 quoted 20.4 us",
            ),
            _row("django-ratelimit is_ratelimited denied", ns["dr denied"], kd, ""),
            _row(
                "info: django-ratelimit allowed, key='ip'", ns["dr allowed ip"], ka, "+ IP parse and /32 mask"
            ),
        ]
    return rows


def _limits_moving_rows() -> list[Row]:
    """limits' moving window holding WINDOW_HITS live hits (its own group: it swaps limits' clock)."""
    step = 3600 / WINDOW_HITS
    storage = limits.storage.MemoryStorage()
    moving = limits.strategies.MovingWindowRateLimiter(storage)
    item = limits.parse(f"{2 * WINDOW_HITS}/hour")
    keyed = _ours_keyed(10**15)
    with _limits_fake_time(time.time()) as fake:
        for _ in range(WINDOW_HITS):
            fake.t += step
            assert moving.hit(item, "peers-moving", IP)

        def hit() -> Any:
            fake.t += step  # one hit spacing per call: the oldest hit leaves as the new one enters
            return moving.hit(item, "peers-moving", IP)

        ns = _measure({"keyed": lambda: keyed.acquire_permission(IP), "moving": hit})
        live = storage.get_moving_window(item.key_for("peers-moving", IP), item.amount, item.get_expiry())[1]
        stored = len(storage.events[item.key_for("peers-moving", IP)])
    assert abs(live - WINDOW_HITS) <= 1, live  # float timestamps: the boundary hit may count either way
    return [
        _row(
            f"limits MovingWindow.hit allowed, {WINDOW_HITS} in window",
            ns["moving"],
            ns["keyed"],
            f"{live} live; list held {stored} (trimmed every 10 ms)",
        )
    ]


# -- circuit breakers ---------------------------------------------------------------------------------------


def _work() -> int:
    return 1


def _growth(fn: Callable[[], None], count: int = REJECTIONS) -> int:
    """Bytes still allocated (tracemalloc) after ``count`` calls of ``fn``, after a warm-up call."""
    fn()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(count):
            fn()
        gc.collect()
        return int(tracemalloc.get_traced_memory()[0] - before)
    finally:
        tracemalloc.stop()


def _growth_row(name: str, grown: int) -> Row:
    per = grown / REJECTIONS
    verdict = "LEAKS" if per >= 1 else "no growth"
    return _row(name, None, None, f"{grown} B total, {per:.2f} B/rejection: {verdict}")


def _breaker_rows() -> list[Row]:
    closed = CircuitBreaker("bench-peers-closed", CircuitBreakerConfig(sliding_window_size=100))
    call = closed.call
    for _ in range(200):  # fill the ring: the steady state of a healthy breaker
        call(_work)
    opened = CircuitBreaker("bench-peers-open", CircuitBreakerConfig(wait_duration_in_open_state="1h"))
    opened.transition_to_open_state()
    ocall = opened.call

    def ours_rejected() -> None:
        try:  # noqa: SIM105 - what a caller writes; contextlib.suppress would add its own cost
            ocall(_work)
        except CallNotPermitted:
            pass

    cases: dict[str, Callable[[], Any]] = {
        "bare": lambda: _work(),  # every subject runs in a lambda: the same frame cost on each side
        "ours closed": lambda: call(_work),
        "ours rejected": ours_rejected,
    }
    if pybreaker is not None:
        pb_closed = pybreaker.CircuitBreaker(fail_max=5, reset_timeout=3600)
        pcall = pb_closed.call
        pb_open = pybreaker.CircuitBreaker(fail_max=5, reset_timeout=3600)
        pb_open.open()
        pocall = pb_open.call
        pb_error = pybreaker.CircuitBreakerError

        def pb_rejected() -> None:
            try:  # noqa: SIM105 - same shape as ours
                pocall(_work)
            except pb_error:
                pass

        cases["pybreaker closed"] = lambda: pcall(_work)
        cases["pybreaker rejected"] = pb_rejected

    ns = _measure(cases)
    bare, oc, orj = ns["bare"], ns["ours closed"], ns["ours rejected"]
    rows = [
        _row("bare call (reference, in a lambda like the rest)", bare, None, ""),
        _row("ours CircuitBreaker.call, CLOSED", oc, oc, f"+{oc - bare:.0f} ns over bare (target <= +300)"),
        _row("ours call rejected by OPEN (raise + catch)", orj, orj, "issue 2 target < 800 ns"),
    ]
    if pybreaker is None:
        rows.append(_skipped("pybreaker"))
    else:
        pc, pr = ns["pybreaker closed"], ns["pybreaker rejected"]
        rows += [
            _row("pybreaker call, CLOSED", pc, oc, f"+{pc - bare:.0f} ns over bare; issue 2 quoted 953 ns"),
            _row("pybreaker call rejected by OPEN (raise + catch)", pr, orj, ""),
        ]
    rows.append(_growth_row(f"memory: ours, {REJECTIONS // 1000}k OPEN rejections", _growth(ours_rejected)))
    if pybreaker is not None:
        rows.append(
            _growth_row(f"memory: pybreaker, {REJECTIONS // 1000}k OPEN rejections", _growth(pb_rejected))
        )
    rows += _purgatory_rows(orj)
    return rows


def _purgatory_rows(ours_rejected_ns: float) -> list[Row]:
    """purgatory raises its OpenedState *instance* again and again: its traceback chain grows per raise."""
    if SyncCircuitBreakerFactory is None:
        return [_skipped("purgatory")]

    def opened_breaker() -> Any:
        breaker = SyncCircuitBreakerFactory(default_threshold=1, default_ttl=3600).get_breaker("bench")
        with contextlib.suppress(ValueError), breaker:
            raise ValueError("trip")
        return breaker

    def rejecter(breaker: Any) -> Callable[[], None]:
        def rejected() -> None:
            try:
                with breaker:
                    _work()
            except OpenedState:
                pass

        return rejected

    timed = opened_breaker()
    # Few iterations: every rejection keeps ~1.6 KB alive, so the usual calibrated loop would hold GBs.
    number = 5_000
    timer = timeit.Timer("f()", globals={"f": rejecter(timed)})
    ns = min(timer.repeat(REPEAT, number)) / number * 1e9
    timed.context._state.__traceback__ = None  # drop the chain the timing built
    grown = _growth(rejecter(opened_breaker()))
    gc.collect()
    return [
        _row(
            "info: purgatory rejected by OPEN (raise + catch)",
            ns,
            ours_rejected_ns,
            "timed over 5k calls only",
        ),
        _growth_row(f"memory: purgatory, {REJECTIONS // 1000}k OPEN rejections", grown),
    ]


# -- over-admission under concurrency -----------------------------------------------------------------------


def _race(make: Callable[[int], Callable[[], bool]], trials: int = TRIALS) -> tuple[int, int, int, list[str]]:
    """(min, max granted, trials over the limit, errors raised) when THREADS threads released together by one
    barrier each ask for one permit."""
    counts = []
    errors: list[str] = []
    for trial in range(trials):
        decide = make(trial)
        barrier = threading.Barrier(THREADS)
        granted: list[bool] = []

        def worker(
            decide: Callable[[], bool] = decide,
            barrier: threading.Barrier = barrier,
            granted: list[bool] = granted,
        ) -> None:
            barrier.wait()
            try:
                ok = decide()
            except Exception as exc:  # a library bug under contention is a result too: count it
                errors.append(f"{type(exc).__name__}: {exc}")
                return
            granted.append(ok)  # list.append is atomic

        threads = [threading.Thread(target=worker) for _ in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        counts.append(sum(granted))
    return min(counts), max(counts), sum(c > RACE_LIMIT for c in counts), errors


def _race_rows(switch_interval: float) -> list[Row]:
    makers: dict[str, Callable[[int], Callable[[], bool]]] = {}
    keyed = _ours_keyed(RACE_LIMIT)
    makers["ours RateLimiter"] = lambda t: _ours(RACE_LIMIT).acquire_permission
    makers["ours KeyedRateLimiter"] = lambda t: (
        lambda: keyed.acquire_permission(f"race-{switch_interval}-{t}")
    )
    if limits is not None:
        storage = limits.storage.MemoryStorage()
        fixed = limits.strategies.FixedWindowRateLimiter(storage)
        moving = limits.strategies.MovingWindowRateLimiter(storage)
        item = limits.parse(f"{RACE_LIMIT}/hour")
        makers["limits FixedWindow"] = lambda t: lambda: fixed.hit(item, "race-f", f"{switch_interval}-{t}")
        makers["limits MovingWindow"] = lambda t: lambda: moving.hit(item, "race-m", f"{switch_interval}-{t}")
    if SimpleRateThrottle is not None:
        makers["DRF SimpleRateThrottle"] = lambda t: _drf_race(f"race:drf:{switch_interval}:{t}")
    if is_ratelimited is not None:
        makers["django-ratelimit"] = lambda t: _dr_case(
            f"race.{switch_interval}.{t}", f"{RACE_LIMIT}/h", _constant_key
        )

    old = sys.getswitchinterval()
    sys.setswitchinterval(switch_interval)
    try:
        results = {name: _race(make) for name, make in makers.items()}
    finally:
        sys.setswitchinterval(old)
    label = f"{switch_interval * 1e6:g} us" if switch_interval < 1e-3 else f"{switch_interval * 1e3:g} ms"
    rows = []
    for name, (low, high, over, errors) in results.items():
        info = f"granted {low}..{high} of {THREADS} (limit {RACE_LIMIT}); over-admitted in {over}/{TRIALS} trials"
        if errors:
            info += f"; {len(errors)} calls raised ({sorted(set(errors))[0]})"
        rows.append(_row(f"race: {name}, switch {label}", None, None, info))
    return rows


def _drf_race(key: str) -> Callable[[], bool]:
    """One throttle instance per thread, as DRF builds one per request; all share one cache key."""
    assert SimpleRateThrottle is not None

    class Throttle(SimpleRateThrottle):  # type: ignore[misc]
        scope = "race"
        rate = f"{RACE_LIMIT}/h"

        def get_cache_key(self, request: Any, view: Any) -> str:
            return key

    request: Any = HttpRequest()
    return lambda: Throttle().allow_request(request, None)


# -- entry points -------------------------------------------------------------------------------------------


def run() -> list[Row]:
    """Measure everything; rows are ``{name, ns_per_op, baseline_ns, ratio, target}`` (baseline = ours)."""
    default_cache = caches["default"]
    if not isinstance(default_cache, LocMemCache):  # pragma: no cover - only if another module reconfigured
        raise RuntimeError("bench_peers needs the default cache to be LocMemCache for a comparable run")
    rows = _ratelimit_rows()
    rows += _breaker_rows()
    rows += _race_rows(sys.getswitchinterval())
    rows += _race_rows(1e-6)
    return rows


def main() -> int:
    """Print the rows in ``run.py``'s format."""
    print(f"{'benchmark':58} {'ns/op':>10} {'baseline':>10} {'ratio':>7}  target / info")
    for r in run():
        ns = "" if r["ns_per_op"] is None else f"{r['ns_per_op']:10.1f}"
        base = "" if r["baseline_ns"] is None else f"{r['baseline_ns']:10.1f}"
        ratio = "" if r["ratio"] is None else f"{r['ratio']:7.2f}"
        print(f"{r['name'][:58]:58} {ns:>10} {base:>10} {ratio:>7}  {r['target']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
