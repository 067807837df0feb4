"""``django_ratelimit_r4.core`` must never import Django: each module is imported in a fresh interpreter."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import django_ratelimit_r4.core as core

ROOT = Path(__file__).resolve().parents[2]
MODULES = sorted(f"django_ratelimit_r4.core.{m.name}" for m in pkgutil.iter_modules(core.__path__))

# One interpreter per module: a module that imports Django is caught even if another module
# imported earlier would have pulled Django in too.
_PROBE = """
import importlib, json, sys
found = {}
for name in sys.argv[1:]:
    importlib.import_module(name)
    found[name] = sorted(m for m in sys.modules if m == "django" or m.startswith("django."))
print(json.dumps(found))
"""


def _probe(*modules: str) -> dict[str, list[str]]:
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, *modules],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_core_has_the_modules_the_architecture_lists() -> None:
    expected = {
        "clock",
        "config",
        "durations",
        "events",
        "exceptions",
        "ratelimiter",
        "bulkhead",
        "circuitbreaker",
        "retry",
        "timelimiter",
    }
    assert expected <= {m.rsplit(".", 1)[1] for m in MODULES}


def test_no_core_module_imports_django() -> None:
    # Each module alone (a fresh interpreter each), then all together.
    offenders = {}
    for module in MODULES:
        found = _probe(module)[module]
        if found:
            offenders[module] = found
    assert offenders == {}, f"these core modules import Django: {offenders}"
    together = _probe(*MODULES)
    assert all(not mods for mods in together.values()), together


def test_the_probe_detects_a_django_import() -> None:
    # The check itself can fail: a module that imports Django is reported.
    assert _probe("django_ratelimit_r4.conf")["django_ratelimit_r4.conf"]
