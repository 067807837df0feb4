"""Compare two checkouts on the Redis decorator paths and the DRF denied paths, interleaved, in thread CPU time.

    R4_REDIS_URL=redis://127.0.0.1:6393/0 python benchmarks/ab_redis_paths.py /path/to/before /path/to/after [alternations]

Not collected by ``run.py`` (no ``bench_`` prefix). :mod:`ab_paths`'s method (one process per checkout and
alternation, each timing every case in-process without WSGI, thread CPU time, the best run counts) for the
paths :mod:`bench_django` ``--peers --cpu`` measures through ``WSGIHandler``: ``@ratelimit`` on Redis, unkeyed
and per ip, allowed and denied; ``RateLimitGate.check`` on Redis denied (the DRF throttle's decision); and DRF
``APIView`` + ``RateLimiterThrottle`` in memory, denied, next to DRF's own ``AnonRateThrottle`` on LocMemCache.
The round trip's wait is not in thread CPU time: what is measured is the client's work around it, against one
bare ``EVALSHA`` of a trivial script (the first row). Keys go under a random prefix, deleted afterwards.
"""

from __future__ import annotations

import sys

from ab_paths import main  # the same runner (benchmarks/ is sys.path[0] when run as a script)

CASES = r'''
import os, sys, time, timeit, uuid
root = sys.argv[1]
sys.path.insert(0, root)
import django
from django.conf import settings
url = os.environ.get("R4_REDIS_URL", "redis://127.0.0.1:6379/15")
prefix = f"r4ab:{uuid.uuid4().hex[:8]}"
big = {"limit_for_period": 10**9, "limit_refresh_period": "1h"}
one = {"limit_for_period": 1, "limit_refresh_period": "1h"}
settings.configure(
    SECRET_KEY="bench-only", DEBUG=False, ALLOWED_HOSTS=["*"], MIDDLEWARE=[], DATABASES={}, LOGGING_CONFIG=None,
    INSTALLED_APPS=["django.contrib.auth", "django.contrib.contenttypes", "rest_framework", "django_ratelimit_r4"],
    CACHES={"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}},
    REST_FRAMEWORK={"DEFAULT_AUTHENTICATION_CLASSES": [], "DEFAULT_PERMISSION_CLASSES": []},
    RATELIMIT_R4={
        "backends": {"shared": {"BACKEND": "redis", "LOCATION": url, "OPTIONS": {"key_prefix": prefix}}},
        "ratelimiters": {"instances": {
            "r_open": {**big, "backend": "shared"},
            "r_closed": {**one, "backend": "shared"},
            "r_keyed_open": {**big, "backend": "shared", "key": "ip"},
            "r_keyed_closed": {**one, "backend": "shared", "key": "ip"},
            "m_keyed_closed": {**one, "key": "ip"},
        }},
    },
)
django.setup()
import logging
logging.getLogger("django.request").setLevel(logging.ERROR)
import django_ratelimit_r4
assert django_ratelimit_r4.__file__.startswith(root), django_ratelimit_r4.__file__
import redis
from django.http import HttpResponse
from django.test import RequestFactory
from rest_framework.response import Response
from rest_framework.throttling import AnonRateThrottle
from rest_framework.views import APIView
from django_ratelimit_r4.decorators import RateLimitGate, ratelimit
from django_ratelimit_r4.rest_framework import RateLimiterThrottle

client = redis.Redis.from_url(url)
sha = client.script_load("return 1")
request = RequestFactory().get("/", REMOTE_ADDR="203.0.113.7")
def view(request):
    return HttpResponse("ok")
views = {name: ratelimit(name)(view) for name in ("r_open", "r_closed", "r_keyed_open", "r_keyed_closed")}
gates = {name: RateLimitGate(name) for name in ("r_closed", "r_keyed_closed")}

class Bare(APIView):
    authentication_classes = []
    permission_classes = []
    throttle_classes = []
    def get(self, request):
        return Response("ok")
class Ours(Bare):
    throttle_classes = [RateLimiterThrottle]
    rate_limiter = "m_keyed_closed"
class Closed(AnonRateThrottle):
    rate = "1/hour"
    scope = "ab-closed"
class Theirs(Bare):
    throttle_classes = [Closed]
drf = {name: cls.as_view() for name, cls in (("bare", Bare), ("ours", Ours), ("theirs", Theirs))}
for fn in (*views.values(), *drf.values()):
    for _ in range(3):
        fn(request)
for gate in gates.values():
    gate.check(request)
assert views["r_closed"](request).status_code == 429 and views["r_keyed_closed"](request).status_code == 429
assert drf["ours"](request).status_code == 429 and drf["theirs"](request).status_code == 429

cases = {
    "bare EVALSHA (1 RT of client work, reference)": lambda: client.evalsha(sha, 0),
    "HttpResponse() alone (reference)": lambda: HttpResponse("ok"),
    "@ratelimit Redis unkeyed, allowed": lambda: views["r_open"](request),
    "@ratelimit Redis unkeyed, denied (429)": lambda: views["r_closed"](request),
    "@ratelimit Redis per ip, allowed": lambda: views["r_keyed_open"](request),
    "@ratelimit Redis per ip, denied (429)": lambda: views["r_keyed_closed"](request),
    "RateLimitGate.check Redis unkeyed, denied": lambda: gates["r_closed"].check(request),
    "RateLimitGate.check Redis per ip, denied": lambda: gates["r_keyed_closed"].check(request),
    "DRF APIView, no throttle (reference)": lambda: drf["bare"](request),
    "DRF + RateLimiterThrottle memory per ip, denied": lambda: drf["ours"](request),
    "DRF + AnonRateThrottle LocMemCache, denied (peer)": lambda: drf["theirs"](request),
}
best = dict.fromkeys(cases, float("inf"))
try:
    for _ in range(5):
        for name, fn in cases.items():
            best[name] = min(best[name], timeit.Timer(fn, timer=time.thread_time).timeit(1000) / 1000 * 1e9)
finally:
    keys = list(client.scan_iter(match=prefix + ":*", count=1000))
    if keys:
        client.delete(*keys)
for name, ns in best.items():
    print(f"{name}|{ns:.0f}")
'''



if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:], CASES))
