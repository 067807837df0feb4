"""django-ratelimit-r4: Resilience4j's rate limiter, bulkhead, circuit breaker, retry and time limiter for Django.

The accessors below read ``settings.RATELIMIT_R4``. They are imported lazily so that
``django_ratelimit_r4.core`` (which never imports Django) can be used without Django configured.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .backends import memory as _memory  # noqa: F401  (registers the in-process backends with core)

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "get_bulkhead",
    "get_circuit_breaker",
    "get_rate_limiter",
    "get_retry",
    "get_time_limiter",
]

if TYPE_CHECKING:
    from .registry import get_bulkhead, get_circuit_breaker, get_rate_limiter, get_retry, get_time_limiter


def __getattr__(name: str) -> Any:
    if name in {"get_rate_limiter", "get_bulkhead", "get_circuit_breaker", "get_retry", "get_time_limiter"}:
        from . import registry

        return getattr(registry, name)
    raise AttributeError(f"module 'django_ratelimit_r4' has no attribute {name!r}")
