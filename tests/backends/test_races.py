"""The multi-process harness of the Redis race tests (races.py) leaves no child behind."""

from __future__ import annotations

import os
import subprocess

import pytest

pytest.importorskip("redis")

from tests.backends.races import run_children


def test_children_are_killed_when_one_overruns_its_timeout() -> None:
    # A child looping for ever once outlived a crashed test run by two hours, deciding against Redis.
    code = "import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(600)"
    with pytest.raises(subprocess.TimeoutExpired):
        run_children(code, 2, timeout=1.0)
    # Both were killed and reaped: nothing of the probe remains among this process's children.
    out = subprocess.run(["ps", "-ww", "-o", "args=", "--ppid", str(os.getpid())], capture_output=True, text=True)
    assert "time.sleep(600)" not in out.stdout, out.stdout


def test_the_outputs_of_children_that_exit_in_time() -> None:
    assert run_children("print('ok')", 3, timeout=60) == ["ok\n"] * 3
