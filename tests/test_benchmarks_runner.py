"""benchmarks/run.py: the runner itself (not the timings)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_runner_names_no_settings_module_that_does_not_exist():
    """Every DJANGO_SETTINGS_MODULE the runner leaves behind must import (it used to name a missing one)."""
    probe = (
        "import importlib, os, runpy, sys\n"
        "runpy.run_path('benchmarks/run.py', run_name='not_main')\n"
        "name = os.environ.get('DJANGO_SETTINGS_MODULE')\n"
        "name is None or importlib.import_module(name)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
