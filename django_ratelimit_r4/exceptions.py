"""Public exceptions (re-exported from :mod:`django_ratelimit_r4.core.exceptions`)."""

from .core.exceptions import (
    BulkheadFull,
    CallNotPermitted,
    CallThrottled,
    ConfigurationError,
    IllegalStateTransition,
    MaxRetriesExceeded,
    RequestNotPermitted,
    ResilienceError,
    TimeLimitExceeded,
)

__all__ = [
    "BulkheadFull",
    "CallNotPermitted",
    "CallThrottled",
    "ConfigurationError",
    "IllegalStateTransition",
    "MaxRetriesExceeded",
    "RequestNotPermitted",
    "ResilienceError",
    "TimeLimitExceeded",
]
