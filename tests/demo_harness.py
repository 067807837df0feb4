"""The demo project as the tests run it: where it lives and a clean environment for it (one copy).

``test_demo.py``, ``test_demo_views.py`` and ``test_demo_servers.py`` each used to build this environment
themselves, and they had drifted (one forgot ``DEMO_STATE_DIR``). ``benchmarks/load_http.py`` keeps its
own copy on purpose: the benchmarks do not import the tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

DEMO = Path(__file__).resolve().parent.parent / "demo_project"

# Variables a developer's shell (or another test) may set that would change what the demo builds.
_CHANGES_THE_DEMO = ("PROMETHEUS_MULTIPROC_DIR", "DEMO_STATE_DIR", "DEMO_BACKEND", "DJANGO_SETTINGS_MODULE")


def demo_env(**overrides: str) -> dict[str, str]:
    """``os.environ`` without the variables that change the demo, an in-memory database, then ``overrides``."""
    env = {name: value for name, value in os.environ.items() if name not in _CHANGES_THE_DEMO}
    env["DEMO_DB"] = ":memory:"
    env.update(overrides)
    return env


def run_in_demo(script: str, timeout: float = 120, **overrides: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -c script`` in the demo's settings, with the demo and the repository importable."""
    env = demo_env(DJANGO_SETTINGS_MODULE="demo.settings", **overrides)
    env["PYTHONPATH"] = os.pathsep.join([str(DEMO), str(DEMO.parent), os.environ.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-c", script], cwd=DEMO, env=env, capture_output=True, text=True, timeout=timeout
    )
