"""How many Redis commands one request through the demo costs, allowed and denied, counted by the server.

Starts its own ``redis-server`` on a free loopback port (nothing else talks to it), runs the demo's Django app
in this process with ``DEMO_BACKEND=redis`` (Django's test client, no HTTP server), and reads
``INFO commandstats`` around N requests to ``POST /authorize`` (per-client 10/s + global 200/s, all-or-nothing)
and to a single-limit view. The figure per request is what a load test pays in round trips on every worker.

Run: ``python benchmarks/redis_round_trips.py [N]`` (needs ``redis-server`` and the ``redis`` extra).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from _timing import dedicated_redis  # benchmarks/ is sys.path[0] when run as a script

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "demo_project"


def main(argv: list[str]) -> int:
    n = int(argv[0]) if argv else 200
    with tempfile.TemporaryDirectory(prefix="r4-rt-") as tmp, dedicated_redis(tmp) as url:
        os.environ.update(
            DJANGO_SETTINGS_MODULE="demo.settings",
            DEMO_BACKEND="redis",
            DEMO_REDIS_URL=url,
            DEMO_DB=":memory:",
            DEMO_STATE_DIR=tmp,
        )
        sys.path[:0] = [str(DEMO), str(ROOT)]
        import django

        django.setup()
        import redis
        from django.test import Client

        raw = redis.Redis.from_url(url)
        client = Client()
        print(f"{'request':44} {'status':>6} {'commands per request (INFO commandstats)'}")
        for label, path, addr_base in (
            ("POST /authorize, allowed (2 limits)", "/authorize", "198.18.1."),
            ("POST /authorize, denied (2 limits)", "/authorize", None),
        ):
            if addr_base is None:
                for _ in range(20):  # spend this client's 10 per second
                    client.post(path)
            raw.config_resetstat()
            status = 0
            for i in range(n):
                extra = {"HTTP_X_FORWARDED_FOR": f"{addr_base}{i % 250}"} if addr_base else {}
                status = client.post(path, **extra).status_code
            stats = raw.info("commandstats")
            calls = {k.removeprefix("cmdstat_"): v["calls"] / n for k, v in stats.items()
                     if not k.startswith("cmdstat_config")}
            print(f"{label:44} {status:>6} " + ", ".join(f"{k} {v:g}" for k, v in sorted(calls.items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
