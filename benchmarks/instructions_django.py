"""Instructions per request of ``bench_django --peers`` rows, counted by valgrind (load-independent).

    R4_REDIS_URL=redis://127.0.0.1:6379/15 python benchmarks/instructions_django.py [N] [ROW ...]

Not collected by ``run.py`` (no ``bench_`` prefix). Each row runs in two processes under ``valgrind
--tool=cachegrind --cache-sim=no`` (``PYTHONHASHSEED=0``): one makes the row's warm-up requests and then ``N``
more (default 300), the other only the warm-up; the difference over ``N`` is the row's user-space instructions
per request, the same requests ``bench_django --peers`` times (``WSGIHandler``, one-pattern urlconf, the peers'
settings). Syscalls and the wait for Redis are not in it: a count, not a time, so a busy machine does not move it
(two runs of one checkout agree within ~1 k instructions). ROW is a ``--peers`` row name (``bare``, ``bare-rt``,
``drf-bare``, ``drf-bare-throttled``, ``drf-r4-redis-allowed``, ...); by default the DRF and decorator rows on Redis
and their baselines. Needs ``valgrind`` on the PATH and the same extras as ``bench_django --peers``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = r"""
import sys
sys.path.insert(0, sys.argv[1])
import bench_django as b
from django.test.utils import override_settings
import logging
logging.getLogger("django.request").setLevel(logging.ERROR)
name, number = sys.argv[2], int(sys.argv[3])
with override_settings(ROOT_URLCONF=b.__name__, MIDDLEWARE=[f"{b.__name__}.urlconf_middleware"], RATELIMIT_R4=b.PEERS_R4):
    b._peer_views()
    call = b._peer_caller(name)
    for _ in range(20):
        response = call()
    status = response.status_code
    for _ in range(number):
        call()
print(status)
"""

DEFAULT_ROWS = [
    "bare",
    "bare-rt",
    "dec-redis-keyed-allowed",
    "dec-redis-keyed-denied",
    "drf-bare",
    "drf-bare-rt",
    "drf-bare-throttled",
    "drf-r4-redis-allowed",
    "drf-r4-redis-denied",
    "drf-own-redis-allowed",
    "drf-own-redis-denied",
]


def instructions(row: str, number: int) -> tuple[int, str]:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cg.out")
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        done = subprocess.run(
            ["valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out}",
             sys.executable, "-c", CHILD, str(HERE), row, str(number)],
            capture_output=True, text=True, env=env, check=True,
        )
        match = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
        assert match is not None, done.stderr[-2000:]
        return int(match.group(1).replace(",", "")), done.stdout.strip()


def main(argv: list[str]) -> int:
    number = int(argv[0]) if argv and argv[0].isdigit() else 300
    rows = [a for a in argv if not a.isdigit()] or DEFAULT_ROWS
    print(f"{'row':34} {'status':>6} {'instructions/request':>21}")
    for row in rows:
        full, status = instructions(row, number)
        base, _ = instructions(row, 0)
        print(f"{row:34} {status:>6} {(full - base) / number:21,.0f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
