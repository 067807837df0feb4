"""Compare two checkouts on the decorator and gate paths, interleaved, in thread CPU time.

    python benchmarks/ab_paths.py /path/to/before /path/to/after [alternations]

Not collected by ``run.py`` (no ``bench_`` prefix). Each alternation runs one process per checkout (before,
then after) that times every case below in-process, without WSGI: the differences this measures are a few
hundred ns, which ``bench_django``'s WSGI rows (tens of µs, wall time) cannot show on a shared machine. Thread
CPU time (``time.thread_time``) leaves out the time the process waits for a core; the best of all runs counts.
Used for issue 10's before/after (benchmarks/README.md).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CASES = r'''
import sys, time, timeit
root = sys.argv[1]
sys.path.insert(0, root)
import django
from django.conf import settings
settings.configure(
    SECRET_KEY="bench-only", DEBUG=False, ALLOWED_HOSTS=["*"], MIDDLEWARE=[], DATABASES={}, LOGGING_CONFIG=None,
    INSTALLED_APPS=["django.contrib.auth", "django.contrib.contenttypes", "django_ratelimit_r4"],
    RATELIMIT_R4={
        "ratelimiters": {"instances": {
            "open": {"limit_for_period": 10**12, "limit_refresh_period": "1h"},
            "keyed": {"limit_for_period": 10**12, "limit_refresh_period": "1h", "key": "ip"},
            "closed": {"limit_for_period": 1, "limit_refresh_period": "1h"},
            "open2": {"limit_for_period": 10**12, "limit_refresh_period": "1h"},
        }},
        "circuitbreakers": {"instances": {"cb": {"wait_duration_in_open_state": "1h"}}},
    },
)
django.setup()
import django_ratelimit_r4
assert django_ratelimit_r4.__file__.startswith(root), django_ratelimit_r4.__file__
from django.http import HttpResponse
from django.test import RequestFactory
from django_ratelimit_r4 import get_circuit_breaker
from django_ratelimit_r4.core.exceptions import CallNotPermitted
from django_ratelimit_r4.decorators import RateLimitGate, circuitbreaker, ratelimit

request = RequestFactory().get("/", REMOTE_ADDR="203.0.113.7")
allowed = ratelimit("open")(lambda request: HttpResponse("ok"))
keyed = ratelimit("keyed")(lambda request: HttpResponse("ok"))
denied = ratelimit("closed")(lambda request: HttpResponse("ok"))
denied(request)
gate_allowed, gate_denied = RateLimitGate("open"), RateLimitGate("closed")
gate_denied.check(request)
# Several limits in memory, all-or-nothing; backends.redis imported as in a process that has Redis limits too.
import django_ratelimit_r4.backends.redis
multi = ratelimit(["open", "open2"])(lambda request: HttpResponse("ok"))
multi_keyed = ratelimit(["keyed", "open"])(lambda request: HttpResponse("ok"))
multi_denied = ratelimit(["open", "closed"])(lambda request: HttpResponse("ok"))
multi_denied(request)
gate_multi, gate_multi_denied = RateLimitGate(["open", "open2"]), RateLimitGate(["open", "closed"])
gate_multi_denied.check(request)
breaker = get_circuit_breaker("cb")
breaker.transition_to_open_state()
def plain(amount):
    return amount
decorated = circuitbreaker("cb")(plain)
core_call = breaker.call
def core_open():
    try:
        core_call(plain, 1)
    except CallNotPermitted:
        pass
def decorated_open():
    try:
        decorated(1)
    except CallNotPermitted:
        pass
cases = {
    "HttpResponse() alone (reference)": lambda: HttpResponse("ok"),
    "@ratelimit allowed (the view builds an HttpResponse)": lambda: allowed(request),
    "@ratelimit keyed by ip, allowed": lambda: keyed(request),
    "@ratelimit denied (429)": lambda: denied(request),
    "RateLimitGate.check allowed (DRF throttle)": lambda: gate_allowed.check(request),
    "RateLimitGate.check denied (DRF throttle)": lambda: gate_denied.check(request),
    "@ratelimit 2 limits in memory, allowed": lambda: multi(request),
    "@ratelimit 2 limits in memory (ip + unkeyed), allowed": lambda: multi_keyed(request),
    "@ratelimit 2 limits in memory, denied (429)": lambda: multi_denied(request),
    "RateLimitGate.check 2 limits in memory, allowed": lambda: gate_multi.check(request),
    "RateLimitGate.check 2 limits in memory, denied": lambda: gate_multi_denied.check(request),
    "CircuitBreaker.call rejected by OPEN": core_open,
    "@circuitbreaker rejected by OPEN, service function": decorated_open,
}
best = dict.fromkeys(cases, float("inf"))
for _ in range(3):
    for name, fn in cases.items():
        best[name] = min(best[name], timeit.Timer(fn, timer=time.thread_time).timeit(2000) / 2000 * 1e9)
for name, ns in best.items():
    print(f"{name}|{ns:.0f}")
'''


def main(argv: list[str], cases: str = CASES) -> int:
    """Run ``cases`` (a program: its argv[1] is a checkout's root, it prints ``name|ns`` lines) in one process
    per checkout and alternation, before then after; print the best of each side and their ratio."""
    before, after = (str(Path(p).resolve()) for p in argv[:2])
    alternations = int(argv[2]) if len(argv) > 2 else 6
    best: dict[tuple[str, str], float] = {}
    order: list[str] = []
    for _ in range(alternations):
        for side, root in (("before", before), ("after", after)):
            out = subprocess.run(
                [sys.executable, "-c", cases, root], capture_output=True, text=True, check=True
            ).stdout
            for line in out.splitlines():
                name, ns = line.rsplit("|", 1)
                if name not in order:
                    order.append(name)
                best[(side, name)] = min(best.get((side, name), float("inf")), float(ns))
    print(f"{'case':54} {'before':>8} {'after':>8} {'after/before':>12}")
    for name in order:
        b, a = best[("before", name)], best[("after", name)]
        print(f"{name:54} {b:8.0f} {a:8.0f} {a / b:12.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
