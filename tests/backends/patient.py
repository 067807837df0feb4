"""Patient Redis timeouts for tests whose subject is exactness, not faults.

On a loaded 2-core machine (CI at load 4: parallel suites, 4 processes x 10 threads) the default 0.25 s socket
timeout hands decisions to the fault policy, and a test counting exact grants then counts the policy's. Faults
and timeouts are tested with URLs of their own (an unreachable port, a stopped ``redis_server``).
"""

from __future__ import annotations

import pytest

#: URL query of 5 s command and connect timeouts.
PATIENT = "socket_timeout=5&socket_connect_timeout=5"


def patient(url: str, seconds: float = 5.0) -> str:
    """``url`` with command and connect timeouts of ``seconds`` added to its query string (which it may have)."""
    return f"{url}{'&' if '?' in url else '?'}socket_timeout={seconds:g}&socket_connect_timeout={seconds:g}"


@pytest.fixture(name="redis_url")
def patient_redis_url(redis_url: str) -> str:
    """The shared test Redis (tests/conftest.py) with :data:`PATIENT` timeouts: importing it into a test module
    overrides the ``redis_url`` fixture there. A test adding its own query must join it with ``&``."""
    return patient(redis_url)
