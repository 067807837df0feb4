"""Shared validation for the frozen config dataclasses of every primitive.

Each ``*Config.__post_init__`` runs a :class:`Validator` over its fields, which normalises values
(durations to integer nanoseconds, dotted paths to classes) and collects *every* error before raising
one :class:`ConfigurationError`. The Django system checks reuse exactly this, so the rules live once.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from typing import Any

from .durations import DURATION_HINT, DurationError, Nanos, format_duration, parse_duration
from .exceptions import ConfigurationError, FieldError

__all__ = [
    "InvalidValue",
    "Validator",
    "boolean_value",
    "callable_value",
    "duration_value",
    "import_string",
    "integer_value",
    "positive_duration_value",
]

#: The hint of a duration above its ``max_ns`` (a config's periods and waits).
_TOO_LONG_HINT = "Longer periods are refused: a client would be told to retry after more than a year."
_CALLABLE_HINT = "Give the full dotted path of a module-level function, e.g. 'myapp.resilience.is_server_error'."
_NOT_CALLABLE_HINT = "In settings, write the function's dotted path as a string; in code, pass the function itself."


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


class InvalidValue(ValueError):
    """One value breaks its rule: ``message`` says how, ``hint`` how to fix it.

    Raised by the rules below, which are the one source of each value rule: a config's :class:`Validator`
    records it as a :class:`FieldError` of its field, the settings analysis (``conf``) as a check problem at the
    setting's path.
    """

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


def duration_value(
    value: object, *, min_ns: int = 0, max_ns: int | None = None, max_hint: str | None = _TOO_LONG_HINT
) -> Nanos:
    """``value`` as integer nanoseconds within ``[min_ns, max_ns]``; a timedelta or a string with a unit."""
    try:
        nanos = parse_duration(value)
    except DurationError as exc:
        raise InvalidValue(str(exc), DURATION_HINT) from None
    if nanos < min_ns:
        raise InvalidValue(f"must be at least {format_duration(min_ns)}, got {format_duration(nanos)}")
    if max_ns is not None and nanos > max_ns:
        raise InvalidValue(f"must be at most {format_duration(max_ns)}, got {format_duration(nanos)}", max_hint)
    return nanos


def positive_duration_value(
    value: object, *, between: tuple[int, int] | None = None, hint: str | None = None
) -> Nanos:
    """A duration longer than 0s and, with ``between=(low, high)``, within those bounds (``hint`` then says why)."""
    nanos = duration_value(value)
    if nanos <= 0:
        raise InvalidValue(f"must be longer than 0s, got {format_duration(nanos)}", DURATION_HINT)
    if between is not None and not between[0] <= nanos <= between[1]:
        raise InvalidValue(
            f"must be between {format_duration(between[0])} and {format_duration(between[1])}, "
            f"got {format_duration(nanos)}",
            hint,
        )
    return nanos


def integer_value(
    value: object, *, minimum: int | None = None, maximum: int | None = None, hint: str | None = None
) -> int:
    """An int (not a bool) within the inclusive bounds."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidValue(f"must be an integer, got {value!r}", hint)
    if minimum is not None and value < minimum:
        raise InvalidValue(f"must be >= {minimum}, got {value}", hint)
    if maximum is not None and value > maximum:
        raise InvalidValue(f"must be <= {maximum}, got {value}", hint)
    return value


def boolean_value(value: object, hint: str | None = None) -> bool:
    """True or False, nothing truthy."""
    if not isinstance(value, bool):
        raise InvalidValue(f"must be True or False, got {value!r}", hint)
    return value


def callable_value(
    value: object, *, import_hint: str | None = _CALLABLE_HINT, hint: str | None = _NOT_CALLABLE_HINT
) -> Callable[..., Any]:
    """A callable, given directly or as a dotted path (imported here; an import that fails says why)."""
    if isinstance(value, str):
        try:
            value = import_string(value)
        except Exception as exc:  # a user module imported by the dotted path may raise anything
            raise InvalidValue(f"cannot import {value!r}: {exc}", import_hint) from None
    if not callable(value):
        raise InvalidValue(f"must be callable or a dotted path to a callable, got {value!r}", hint)
    return value


class Validator:
    """Collects field errors while a config normalises itself (each check is one of the rules above)."""

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
            self._set(name, duration_value(value, min_ns=min_ns, max_ns=max_ns))
        except InvalidValue as exc:
            self.error(name, exc.message, exc.hint)

    def integer(self, name: str, *, minimum: int | None = None, maximum: int | None = None) -> None:
        """Check an integer field against inclusive bounds."""
        try:
            integer_value(getattr(self.config, name), minimum=minimum, maximum=maximum)
        except InvalidValue as exc:
            self.error(name, exc.message, exc.hint)

    def number(
        self, name: str, *, gt: float | None = None, ge: float | None = None, le: float | None = None
    ) -> None:
        """Check a float field (ints accepted and converted) against bounds."""
        value = getattr(self.config, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.error(name, f"must be a number, got {value!r}")
            return
        try:
            value = float(value)
        except OverflowError:  # an int beyond the float range: a clear message, not "cannot be built"
            self.error(name, f"must be a number, got an integer too large for a float ({value.bit_length()} bits)")
            return
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
        try:
            boolean_value(getattr(self.config, name))
        except InvalidValue as exc:
            self.error(name, exc.message, exc.hint)

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
        try:
            self._set(name, callable_value(value))
        except InvalidValue as exc:
            self.error(name, exc.message, exc.hint)

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

