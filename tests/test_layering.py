"""The package's layers point one way (issue 10, item 2); tests/core/test_layering.py covers ``core/``.

    core  ->  backends (+ keyed stores)  ->  conf / registry  ->  HTTP edge | operations

Checked on the source: every ``import`` / ``from ... import`` statement, also inside functions and
``TYPE_CHECKING`` blocks, resolved to the package module it reaches. See docs/architecture.md, "Layers".
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "django_ratelimit_r4"
PACKAGE = "django_ratelimit_r4"

#: The request edge: what runs around a view (decorators, gate, middleware, DRF, responses, fields, keys).
HTTP_EDGE = frozenset(
    {"decorators", "gate", "fallbacks", "middleware", "responses", "headers", "keys", "rest_framework"}
)
#: Operations: what an operator runs or scrapes (command, state endpoint, health, metrics, signals, stall).
OPERATIONS = frozenset(
    {"checks", "control", "state", "views", "urls", "health", "signals", "stall", "management", "contrib", "testing"}
)
#: Where rate-limiter state lives: the backends and the in-memory keyed stores.
BACKENDS = frozenset({"backends", "keyed", "keyed_smooth"})
#: RATELIMIT_R4 read, validated and turned into instances, with the rules the validation needs.
SETTINGS = frozenset({"conf", "keyspec", "ip", "registry"})
#: The package's own wiring: the app config, the public re-exports, the pytest plugin.
GLUE = frozenset({"__init__", "apps", "exceptions", "pytest_plugin"})
LAYERS = {"core": frozenset({"core"}), "backends": BACKENDS, "settings": SETTINGS, "HTTP edge": HTTP_EDGE}
LAYERS |= {"operations": OPERATIONS, "glue": GLUE}
#: The arrows that still point up, each with its reason; this set may only shrink.
KNOWN_UPWARD = {
    ("registry", "checks"),  # the first build warns about multi-process in-memory limits (checks.detect_multiprocess)
}


def _module_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE_DIR).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join([PACKAGE, *parts])


def imports_of(path: Path) -> list[tuple[int, str, tuple[str, ...]]]:
    """``(line, absolute module, names)`` of every import in ``path`` that reaches this package."""
    module = _module_of(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target.split(".")[0] == PACKAGE:
                names = tuple(alias.name for alias in node.names)
                if target == PACKAGE or not node.module:  # from . import conf: the names are modules
                    for name in names:
                        found.append((node.lineno, f"{target}.{name}", ()))
                else:
                    found.append((node.lineno, target, names))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name, ()) for a in node.names if a.name.split(".")[0] == PACKAGE]
    return found


def _top(module: str) -> str:
    """``django_ratelimit_r4.backends.redis`` -> ``backends``."""
    return module.split(".")[1] if module.count(".") else ""


def _reaching(name: str, tops: frozenset[str]) -> list[str]:
    path = PACKAGE_DIR / f"{name}.py"
    return [f"line {line}: {target}" for line, target, _ in imports_of(path) if _top(target) in tops]


def test_the_resolver_sees_each_kind_of_import() -> None:
    found = imports_of(PACKAGE_DIR / "decorators.py")
    assert (PACKAGE + ".registry") in {target for _, target, _ in found}  # from . import conf, registry
    assert any(target == PACKAGE + ".gate" and "RateLimitGate" in names for _, target, names in found)
    breaker = imports_of(PACKAGE_DIR / "core" / "circuitbreaker" / "breaker.py")
    assert all(target.startswith(PACKAGE + ".core.") for _, target, _ in breaker)


@pytest.mark.parametrize("name", ["conf", "keyspec"])
def test_settings_import_nothing_from_the_http_edge_or_operations(name: str) -> None:
    """conf validates ``headers`` and ``key`` with rules it can import (keyspec; the style names are its own)."""
    assert _reaching(name, HTTP_EDGE | OPERATIONS) == []


def test_registry_imports_nothing_from_the_http_edge() -> None:
    assert _reaching("registry", HTTP_EDGE) == []


def test_registry_imports_no_redis_module() -> None:
    """The registry builds every backend through its store's factory (issue 9): no ``backends.redis*`` import,
    not even a lazy one for a Redis-only option (a lease is the Redis store's ``lease`` keyword)."""
    redis = [
        f"line {line}: {target}"
        for line, target, names in imports_of(PACKAGE_DIR / "registry.py")
        if target.startswith(f"{PACKAGE}.backends.redis")
        or (target == f"{PACKAGE}.backends" and any(n.startswith("redis") for n in names))
    ]
    assert redis == []


@pytest.mark.parametrize("name", sorted(HTTP_EDGE))
def test_the_http_edge_imports_no_private_name_of_another_module(name: str) -> None:
    """No ``from .keyed import _helper``: what a module needs from another is public there."""
    private = [
        f"line {line}: from {target} import {n}"
        for line, target, names in imports_of(PACKAGE_DIR / f"{name}.py")
        for n in names
        if n.startswith("_") and not n.startswith("__")
        and not (name == "decorators" and target == f"{PACKAGE}.gate")  # re-exports of its old names
    ]
    assert private == []


def test_nothing_imports_from_the_middleware() -> None:
    """The middleware is a small translation at the top: the responses it gives are built in responses.py."""
    importers = [
        f"{path.relative_to(PACKAGE_DIR)} line {line}"
        for path in PACKAGE_DIR.rglob("*.py")
        if path.name != "middleware.py"
        for line, target, _ in imports_of(path)
        if target == f"{PACKAGE}.middleware"
    ]
    assert importers == []


def test_the_middleware_only_translates() -> None:
    # core: only core.coroutines.is_async, the one sync-or-async check of the package.
    assert {_top(t) for _, t, _ in imports_of(PACKAGE_DIR / "middleware.py")} <= {"responses", "stall", "core"}


def test_the_decorators_reach_limiters_through_the_gate() -> None:
    """decorators.py holds the decorators: keyed stores, headers and backends are the gate's business."""
    tops = {_top(t) for _, t, _ in imports_of(PACKAGE_DIR / "decorators.py")}
    assert tops.isdisjoint({"keyed", "keyed_smooth", "headers", "keys", "ip", "backends", "middleware"})


def test_only_responses_and_headers_build_http_output() -> None:
    """The 429/503 body is built in responses.py; the RateLimit fields are formatted in headers.py."""
    for name in ("decorators", "gate", "middleware", "rest_framework"):
        source = (PACKAGE_DIR / f"{name}.py").read_text(encoding="utf-8")
        assert "HttpResponse(" not in source, name
        assert ";r=" not in source.replace('+ ";r="', ""), name  # the draft-10 member is formatted in headers.py


def _layer_of(top: str) -> str:
    return next(layer for layer, members in LAYERS.items() if top in members)


def test_every_module_has_a_layer() -> None:
    """A new module is placed in one layer here (and in docs/architecture.md) before it can land."""
    tops = {path.relative_to(PACKAGE_DIR).parts[0].removesuffix(".py") for path in PACKAGE_DIR.rglob("*.py")}
    unplaced = sorted(top for top in tops if not any(top in members for members in LAYERS.values()))
    assert unplaced == []
    assert sum(len(members) for members in LAYERS.values()) == len(frozenset().union(*LAYERS.values()))


def test_backends_import_only_core_and_backends() -> None:
    paths = [*(PACKAGE_DIR / "backends").rglob("*.py"), PACKAGE_DIR / "keyed.py", PACKAGE_DIR / "keyed_smooth.py"]
    wrong = [
        f"{path.relative_to(PACKAGE_DIR)} line {line}: {target}"
        for path in paths
        for line, target, _ in imports_of(path)
        if _top(target) not in BACKENDS | {"core"}
    ]
    assert wrong == []


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_settings_import_only_lower_layers(name: str) -> None:
    wrong = [
        f"line {line}: {target}"
        for line, target, _ in imports_of(PACKAGE_DIR / f"{name}.py")
        if _layer_of(_top(target)) not in ("core", "backends", "settings") and (name, _top(target)) not in KNOWN_UPWARD
    ]
    assert wrong == []
