"""The shipped Grafana dashboard and the operations guide cover every metric and stay well-formed."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"

#: Series fixed by issue 4, as they appear in PromQL (timers and histograms by a suffix).
METRICS = (
    "resilience4j_ratelimiter_available_permissions",
    "resilience4j_ratelimiter_waiting_threads",
    "resilience4j_ratelimiter_calls_total",
    "resilience4j_bulkhead_available_concurrent_calls",
    "resilience4j_bulkhead_max_allowed_concurrent_calls",
    "resilience4j_circuitbreaker_state",
    "resilience4j_circuitbreaker_failure_rate",
    "resilience4j_circuitbreaker_slow_call_rate",
    "resilience4j_circuitbreaker_buffered_calls",
    "resilience4j_circuitbreaker_calls_seconds",
    "resilience4j_circuitbreaker_not_permitted_calls_total",
    "resilience4j_retry_calls_total",
    "resilience4j_timelimiter_calls_total",
    "r4_event_loop_stalls_total",
    "r4_event_loop_stall_seconds",
)
ALLOWED_LABELS = {"name", "kind", "state", "job", "instance", "le", "pid", "__name__"}
_SELECTOR = re.compile(r"\{([^{}]*)\}")
_MATCHER = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"[^"]*"\s*')


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads((DOCS / "grafana-dashboard.json").read_text(encoding="utf-8"))


def _queries(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] if p["type"] != "row" for t in p["targets"]]


def test_dashboard_is_a_grafana_dashboard(dashboard: dict[str, Any]) -> None:
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert dashboard["uid"] and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"] and panel["description"], panel["title"]
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])


def test_panels_fit_the_grid_without_overlapping(dashboard: dict[str, Any]) -> None:
    boxes = []
    for panel in dashboard["panels"]:
        g = panel["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, panel["title"]
        boxes.append((g["x"], g["y"], g["x"] + g["w"], g["y"] + g["h"], panel["title"]))
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            overlap = a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]
            assert not overlap, (a[4], b[4])


@pytest.mark.parametrize("metric", METRICS)
def test_every_metric_has_a_panel(dashboard: dict[str, Any], metric: str) -> None:
    pattern = re.compile(rf"\b{re.escape(metric)}(_count|_sum|_bucket)?\b")
    assert any(pattern.search(q) for q in _queries(dashboard)), metric


def test_queries_are_balanced_and_never_select_client_keys(dashboard: dict[str, Any]) -> None:
    for query in _queries(dashboard):
        for opening, closing in ("()", "{}", "[]"):
            depth = 0
            for char in query:
                depth += (char == opening) - (char == closing)
                assert depth >= 0, query
            assert depth == 0, query
        for selector in _SELECTOR.findall(query):
            labels = [m.group(1) for m in _MATCHER.finditer(selector)]
            # Every matcher parsed: nothing left over but separating commas.
            assert _MATCHER.sub("", selector).replace(",", "").strip() == "", selector
            assert set(labels) <= ALLOWED_LABELS, (labels, query)
        for clause in re.findall(r"by \(([^)]*)\)", query):
            assert {label.strip() for label in clause.split(",")} <= ALLOWED_LABELS, query


def test_rates_use_counters_only(dashboard: dict[str, Any]) -> None:
    for query in _queries(dashboard):
        for inner in re.findall(r"(?:rate|increase)\((\w+)", query):
            assert inner.endswith(("_total", "_count", "_sum", "_bucket")), query


@pytest.mark.parametrize("metric", METRICS)
def test_operations_guide_documents_every_metric(metric: str) -> None:
    text = (DOCS / "operations.md").read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith(f"| `{metric}`")]
    assert len(rows) == 1, metric
    cells = [c.strip() for c in re.split(r"(?<!\\)\|", rows[0].strip().strip("|"))]  # "\|" is a literal pipe
    assert len(cells) == 4 and all(cells), rows[0]  # series, type, labels, meaning
    assert "`name`" in cells[2]
