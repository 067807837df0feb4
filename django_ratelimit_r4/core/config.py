"""Shared validation for the frozen config dataclasses of every primitive.

Each ``*Config.__post_init__`` runs a :class:`Validator` over its fields, which normalises values
(durations to integer nanoseconds, dotted paths to classes) and collects *every* error before raising
one :class:`ConfigurationError`. The Django system checks reuse exactly this, so the rules live once.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any

from .durations import DurationError, parse_duration
from .exceptions import ConfigurationError, FieldError

__all__ = ["Validator", "import_string"]


def import_string(dotted_path: str) -> Any:
    """Import ``"package.module.Name"`` and return ``Name`` (no Django needed)."""
    try:
        module_path, attr = dotted_path.rsplit(".", 1)
    except ValueError:
        raise ImportError(f"'{dotted_path}' is not a dotted path") from None
    module = importlib.import_module(module_path)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ImportError(f"module '{module_path}' has no attribute '{attr}'") from None


class Validator:
    """Collects field errors while a config normalises itself."""

    def __init__(self, config: object) -> None:
        self.config = config
        self.errors: list[FieldError] = []

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self.config, name, value)

    def error(self, name: str, message: str, hint: str | None = None) -> None:
        """Record an error for field ``name``."""
        self.errors.append(FieldError(name, message, hint))

    def duration(
        self, name: str, *, min_ns: int = 0, max_ns: int | None = None, allow_none: bool = False
    ) -> None:
        """Normalise a duration field to integer nanoseconds, with a lower and an optional upper bound."""
        value = getattr(self.config, name)
        if value is None and allow_none:
            return
        try:
            nanos = parse_duration(value)
        except DurationError as exc:
            self.error(name, str(exc), "Write durations as timedelta or a string with a unit: '500ms', '1s', '5m'.")
            return
        if nanos < min_ns:
            from .durations import format_duration

            self.error(name, f"must be at least {format_duration(min_ns)}, got {format_duration(nanos)}")
            return
        if max_ns is not None and nanos > max_ns:
            from .durations import format_duration

            self.error(
                name,
                f"must be at most {format_duration(max_ns)}, got {format_duration(nanos)}",
                "Longer periods are refused: a client would be told to retry after more than a year.",
            )
            return
        self._set(name, nanos)

    def integer(self, name: str, *, minimum: int | None = None, maximum: int | None = None) -> None:
        """Check an integer field against inclusive bounds."""
        value = getattr(self.config, name)
        if isinstance(value, bool) or not isinstance(value, int):
            self.error(name, f"must be an integer, got {value!r}")
            return
        if minimum is not None and value < minimum:
            self.error(name, f"must be >= {minimum}, got {value}")
        elif maximum is not None and value > maximum:
            self.error(name, f"must be <= {maximum}, got {value}")

    def number(
        self, name: str, *, gt: float | None = None, ge: float | None = None, le: float | None = None
    ) -> None:
        """Check a float field (ints accepted and converted) against bounds."""
        value = getattr(self.config, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.error(name, f"must be a number, got {value!r}")
            return
        value = float(value)
        if gt is not None and not value > gt:
            self.error(name, f"must be > {gt:g}, got {value:g}")
        elif ge is not None and not value >= ge:
            self.error(name, f"must be >= {ge:g}, got {value:g}")
        elif le is not None and not value <= le:
            self.error(name, f"must be <= {le:g}, got {value:g}")
        else:
            self._set(name, value)

    def boolean(self, name: str) -> None:
        """Check a boolean field."""
        value = getattr(self.config, name)
        if not isinstance(value, bool):
            self.error(name, f"must be True or False, got {value!r}")

    def choice(self, name: str, choices: Iterable[str]) -> None:
        """Check a string enum field (case-insensitive; stored upper-case)."""
        value = getattr(self.config, name)
        options = tuple(choices)
        normalised = getattr(value, "name", value)
        if isinstance(normalised, str) and normalised.upper() in options:
            self._set(name, normalised.upper())
        else:
            self.error(name, f"must be one of {', '.join(options)}, got {value!r}")

    def exception_classes(self, name: str) -> None:
        """Normalise a sequence of exception classes or dotted paths to a tuple of classes."""
        value = getattr(self.config, name)
        if isinstance(value, (str, type)):
            value = (value,)
        if not isinstance(value, Iterable):
            self.error(name, f"must be a list of exception classes or dotted paths, got {value!r}")
            return
        classes: list[type[BaseException]] = []
        for item in value:
            if isinstance(item, str):
                try:
                    item = import_string(item)
                except ImportError as exc:
                    self.error(name, f"cannot import '{item}': {exc}", "Use the full dotted path, e.g. 'requests.exceptions.Timeout'.")
                    continue
            if not (isinstance(item, type) and issubclass(item, BaseException)):
                self.error(name, f"{item!r} is not an exception class")
                continue
            classes.append(item)
        self._set(name, tuple(classes))

    def callable_or_path(self, name: str) -> None:
        """Normalise an optional callable given directly or as a dotted path."""
        value = getattr(self.config, name)
        if value is None:
            return
        if isinstance(value, str):
            try:
                value = import_string(value)
            except ImportError as exc:
                self.error(
                    name,
                    f"cannot import '{getattr(self.config, name)}': {exc}",
                    "Give the full dotted path of a module-level function, e.g. 'myapp.resilience.is_server_error'.",
                )
                return
        if not callable(value):
            self.error(
                name,
                f"must be callable or a dotted path to a callable, got {value!r}",
                "In settings, write the function's dotted path as a string; in code, pass the function itself.",
            )
            return
        self._set(name, value)

    def check(self, name: str, ok: bool, message: str, hint: str | None = None) -> None:
        """Record ``message`` for ``name`` unless ``ok``."""
        if not ok:
            self.error(name, message, hint)

    def done(self) -> None:
        """Raise one :class:`ConfigurationError` listing every error found."""
        if self.errors:
            raise ConfigurationError(type(self.config).__name__, self.errors)


def field_names(cls: type) -> tuple[str, ...]:
    """The public field names of a config dataclass (what settings may set)."""
    import dataclasses

    return tuple(f.name for f in dataclasses.fields(cls) if not f.name.startswith("_"))

