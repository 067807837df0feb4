"""W001 where the operator looks: a worker of a multi-process server with in-memory rate limiters says
so once, in its own log, when it builds its first limiter (``django_ratelimit_r4`` logger, WARNING)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from django_ratelimit_r4 import get_bulkhead, get_rate_limiter, registry

ROOT = Path(__file__).resolve().parent.parent
SERVER_VARS = ("WEB_CONCURRENCY", "GUNICORN_CMD_ARGS", "SERVER_SOFTWARE")

# Runs in a fresh interpreter, like a server's worker: builds limiters (plain and keyed, twice, across a
# settings change), forks a child that builds one more, and prints each warning as a JSON line.
WORKER = r"""
import json, logging, os, sys
import django
from django.test import override_settings

class Out(logging.Handler):
    def emit(self, record):
        print(json.dumps({"pid": os.getpid(), "name": record.name, "level": record.levelname,
                          "message": record.getMessage()}), flush=True)

django.setup()
logging.getLogger("django_ratelimit_r4").addHandler(Out())
from django_ratelimit_r4 import get_circuit_breaker, get_rate_limiter

get_circuit_breaker("acquirer")  # not a rate limiter: nothing to say yet
print(json.dumps({"mark": "before first use"}), flush=True)
with override_settings(RATELIMIT_R4={"ratelimiters": {"instances": {"other": {}}}}):
    get_rate_limiter("other").acquire_permission()
for _ in range(3):
    get_rate_limiter("api").acquire_permission()
get_rate_limiter("slow", key="203.0.113.7").acquire_permission()
pid = os.fork()
if pid == 0:  # a worker forked after its parent built every limiter it uses (gunicorn --preload)
    get_rate_limiter("api").acquire_permission()
    get_rate_limiter("slow", key="203.0.113.7").acquire_permission()
    os._exit(0)
os.waitpid(pid, 0)
"""


def _worker(extra_env: dict[str, str], *argv: str, settings_code: str = "") -> list[dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if k not in SERVER_VARS}
    env.update(DJANGO_SETTINGS_MODULE="tests.settings", PYTHONPATH=str(ROOT), **extra_env)
    script = settings_code + WORKER
    done = subprocess.run(
        [sys.executable, "-c", script, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX fork")
def test_a_worker_under_several_processes_warns_once_in_its_log() -> None:
    lines = _worker({"WEB_CONCURRENCY": "4"})
    assert lines[0] == {"mark": "before first use"}  # building a breaker said nothing
    records = lines[1:]
    assert len(records) == 2, records  # the parent once, the forked child once
    assert len({r["pid"] for r in records}) == 2
    # The parent's first limiter was built under other settings; the child names what it inherited.
    for record, names in zip(
        records, ["rate limiters 'other' keep", "rate limiters 'api', 'slow', 'per_ip', 'burst', 'burst3', 'sustained' keep"], strict=True
    ):
        assert (record["name"], record["level"]) == ("django_ratelimit_r4", "WARNING")
        message = record["message"]
        assert names in message and "WEB_CONCURRENCY=4" in message
        assert f"pid {record['pid']}" in message
        assert 'RATELIMIT_R4["backend"] = "redis"' in message
        assert 'SILENCED_SYSTEM_CHECKS = ["ratelimit_r4.W001"]' in message


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX fork")
def test_gunicorn_started_with_python_m_and_workers_on_its_command_line() -> None:
    fake_argv0 = "/venv/lib/python3/site-packages/gunicorn/__main__.py"
    code = f"import sys; sys.argv[0] = {fake_argv0!r}\n"
    many = _worker({"SERVER_SOFTWARE": "gunicorn/23.0.0"}, "demo.wsgi", "--workers", "2", settings_code=code)
    assert len(many) == 3 and "--workers 2 on the command line" in many[1]["message"]
    one = _worker({"SERVER_SOFTWARE": "gunicorn/23.0.0"}, "demo.wsgi", "--workers", "1", settings_code=code)
    assert one == [{"mark": "before first use"}]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX fork")
def test_no_warning_for_one_process_or_when_silenced() -> None:
    quiet = [{"mark": "before first use"}]
    assert _worker({}) == quiet
    assert _worker({"WEB_CONCURRENCY": "1"}) == quiet
    # The documented way to say "per-process limits are intended" silences the check and the log line.
    silenced = "import tests.settings as s; s.SILENCED_SYSTEM_CHECKS = ['ratelimit_r4.W001']\n"
    assert _worker({"WEB_CONCURRENCY": "4"}, settings_code=silenced) == quiet


# ------------------------------------------------------------------ the same, in process, with caplog


@pytest.fixture
def first_use(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh registry generation in a process that has not looked yet, under WEB_CONCURRENCY=4."""
    for var in SERVER_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WEB_CONCURRENCY", "4")
    monkeypatch.setattr(registry, "_multiprocess_checked_pid", None)
    registry.invalidate()


def test_the_warning_names_the_limiters_and_the_fix(first_use: None, caplog: Any) -> None:
    caplog.set_level(logging.WARNING, logger="django_ratelimit_r4")
    get_bulkhead("acquirer")
    assert caplog.records == []
    for _ in range(5):
        get_rate_limiter("api").acquire_permission()
        get_rate_limiter("slow", key="k").acquire_permission()
    ours = [r for r in caplog.records if r.name == "django_ratelimit_r4"]
    assert len(ours) == 1 and ours[0].levelno == logging.WARNING
    text = ours[0].getMessage()
    assert "rate limiters 'api', 'slow', 'per_ip', 'burst', 'burst3', 'sustained' keep their state in this process's memory" in text
    assert "a limit of 10 becomes 10 x N workers" in text and "WEB_CONCURRENCY=4" in text


def test_no_warning_with_the_redis_backend(first_use: None, caplog: Any) -> None:
    caplog.set_level(logging.WARNING, logger="django_ratelimit_r4")
    config = {
        "backend": "redis",
        "redis_url": "redis://127.0.0.1:6379/15",
        "ratelimiters": {"instances": {"a": {}}},
    }
    with override_settings(RATELIMIT_R4=config):
        get_rate_limiter("a")  # built, not called: no connection needed
        registry.get_keyed_rate_limiter("a")
    assert [r for r in caplog.records if r.name == "django_ratelimit_r4"] == []
