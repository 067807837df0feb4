"""Sync/async twins kept as copies on purpose (the hot path pays no shared helper's frame) stay in step.

``CircuitBreaker.call``/``acall`` have their own proof (tests/core/test_circuitbreaker_twins.py). The same
check here for the other inlined pairs: ``Bulkhead.call``/``acall`` (the adaptive sample's release inlined,
~80 ns a call), ``RedisCircuitBreaker.call``/``acall`` (the cluster trial around the core's call) and
``backends.redis.read_quotas``/``aread_quotas`` (a mixed gate's 429 figures in one round trip). Their
syntax trees must be identical once ``await`` is removed and the async names are read as their sync twins,
so a fix made to one and not the other fails here.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable
from typing import Any

import pytest

from django_ratelimit_r4.backends.redis import aread_quotas, read_quotas
from django_ratelimit_r4.backends.redis_breaker import RedisCircuitBreaker
from django_ratelimit_r4.core.bulkhead import Bulkhead


class _AsSync(ast.NodeTransformer):
    """Drops ``await`` and renames the async twins' names (and annotations) to the sync ones."""

    def __init__(self, renames: dict[str, str]) -> None:
        self.renames = renames

    def visit_Await(self, node: ast.Await) -> ast.AST:
        return self.visit(node.value)

    def visit_Name(self, node: ast.Name) -> ast.AST:
        node.id = self.renames.get(node.id, node.id)
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        node.attr = self.renames.get(node.attr, node.attr)
        return node


def _body(method: Callable[..., Any], renames: dict[str, str]) -> str:
    fn = ast.parse(textwrap.dedent(inspect.getsource(method))).body[0]
    assert isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
    body = fn.body[1:] if ast.get_docstring(fn) is not None else fn.body
    return ast.dump(ast.Module(body=[_AsSync(renames).visit(stmt) for stmt in body], type_ignores=[]))


@pytest.mark.parametrize(
    ("sync", "async_", "renames"),
    [
        (Bulkhead.call, Bulkhead.acall, {"atry_acquire_permission": "try_acquire_permission"}),
        (
            RedisCircuitBreaker.call,
            RedisCircuitBreaker.acall,
            {"_core_acall": "_core_call", "_aenter": "_enter", "acall": "call"},
        ),
        (read_quotas, aread_quotas, {"arun_scripts": "run_scripts", "_astate_at": "_state_at"}),
    ],
    ids=["Bulkhead", "RedisCircuitBreaker", "read_quotas"],
)
def test_call_and_acall_differ_only_in_the_await(
    sync: Callable[..., Any], async_: Callable[..., Any], renames: dict[str, str]
) -> None:
    assert inspect.iscoroutinefunction(async_) and not inspect.iscoroutinefunction(sync)
    assert _body(sync, {}) == _body(async_, renames), "call() and acall() diverged: make the same change to both"
