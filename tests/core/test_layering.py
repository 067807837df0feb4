"""The layers point one way: ``django_ratelimit_r4/core/`` imports nothing outside ``core/`` (issue 9).

Checked on the source (every ``import`` and ``from ... import`` statement, also inside functions and
``TYPE_CHECKING`` blocks), so a new module of ``core/`` is covered without being listed here.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "django_ratelimit_r4" / "core"
PACKAGE = "django_ratelimit_r4"


def _outside_core(path: Path, depth: int = 0) -> list[str]:
    """Every import in ``path`` that reaches a module of this package outside ``core/``.

    ``depth``: how many packages below ``core/`` the file sits (1 in ``core/circuitbreaker/``, where
    ``from ..clock import`` is still inside core).
    """
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level > 1 + depth:  # from ..x in core/x.py: the package above core/
                found.append(f"line {node.lineno}: from {'.' * node.level}{node.module or ''} import ...")
            elif (
                node.level == 0
                and node.module
                and node.module.split(".")[0] == PACKAGE
                and not node.module.startswith(f"{PACKAGE}.core")
            ):
                found.append(f"line {node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE and not alias.name.startswith(f"{PACKAGE}.core"):
                    found.append(f"line {node.lineno}: import {alias.name}")
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
            "import_module",
            "__import__",
        ):
            arg = node.args[0] if node.args else None
            text = arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else ""
            if text.startswith(PACKAGE) and not text.startswith(f"{PACKAGE}.core"):
                found.append(f"line {node.lineno}: import_module({text!r})")
    return found


@pytest.mark.parametrize("path", sorted(CORE.rglob("*.py")), ids=lambda p: str(p.relative_to(CORE)))
def test_core_imports_nothing_outside_core(path: Path) -> None:
    depth = len(path.relative_to(CORE).parts) - 1  # core/circuitbreaker/breaker.py: 1
    assert _outside_core(path, depth) == [], f"{path.relative_to(ROOT)} imports outside core/"


def test_subpackages_of_core_are_checked_too() -> None:
    assert any(p.parent.name == "circuitbreaker" for p in CORE.rglob("*.py"))
    sample = CORE / "circuitbreaker" / "breaker.py"
    assert _outside_core(sample, 1) == []
    assert _outside_core(sample, 0) != []  # its "from .." imports would leave core from one level up


def test_the_check_sees_each_kind_of_import(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from typing import TYPE_CHECKING\n"
        "from .clock import Clock\n"
        "from django_ratelimit_r4.core.clock import Clock\n"
        "if TYPE_CHECKING:\n"
        "    from ..backends.base import Store\n"
        "def f():\n"
        "    from ..keyed import KeyedRateLimiter\n"
        "    import django_ratelimit_r4.registry\n"
        "    importlib.import_module('django_ratelimit_r4.backends.memory')\n"
    )
    assert [line.split(":")[0] for line in _outside_core(sample)] == ["line 5", "line 7", "line 8", "line 9"]


def test_a_rate_limiter_built_from_core_alone_keeps_its_in_memory_default() -> None:
    """The in-process backends are injected into core when the package is imported (nothing else needed)."""
    probe = (
        "from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig\n"
        "from django_ratelimit_r4.backends.memory import GcraBackend, MemoryBackend\n"
        "a = RateLimiter('a', RateLimiterConfig(limit_for_period=1, limit_refresh_period='1h'))\n"
        "g = RateLimiter('g', RateLimiterConfig(limit_for_period=1, limit_refresh_period='1h', algorithm='gcra'))\n"
        "assert type(a.backend) is MemoryBackend and type(g.backend) is GcraBackend\n"
        "assert a.acquire_permission() and not a.acquire_permission()\n"
        "import sys; assert not any(m == 'django' or m.startswith('django.') for m in sys.modules)\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.stdout.strip() == "ok", result.stderr
