"""The shipped Grafana dashboard and the operations guide cover every metric and stay well-formed.

The guide is checked against what ``contrib/prometheus.py`` really exports: a live scrape with every
primitive configured (series names and labels) and the gauges it builds for multiprocess mode.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Gauge

DOCS = Path(__file__).resolve().parent.parent / "docs"

#: Series fixed by issue 4, as they appear in PromQL (timers and histograms by a suffix).
METRICS = (
    "resilience4j_ratelimiter_available_permissions",
    "resilience4j_ratelimiter_waiting_threads",
    "resilience4j_ratelimiter_calls_total",
    "resilience4j_bulkhead_available_concurrent_calls",
    "resilience4j_bulkhead_max_allowed_concurrent_calls",
    "r4_bulkhead_cluster_concurrent_calls",
    "r4_bulkhead_cluster_expired_leases",
    "r4_bulkhead_lost_leases_total",
    "resilience4j_circuitbreaker_state",
    "resilience4j_circuitbreaker_failure_rate",
    "resilience4j_circuitbreaker_slow_call_rate",
    "resilience4j_circuitbreaker_buffered_calls",
    "resilience4j_circuitbreaker_calls_seconds",
    "resilience4j_circuitbreaker_not_permitted_calls_total",
    "resilience4j_retry_calls_total",
    "resilience4j_timelimiter_calls_total",
    "r4_retry_budget_exhausted_calls_total",
    "r4_retry_budget_balance",
    "r4_adaptive_throttler_calls_total",
    "r4_adaptive_throttler_rejection_probability",
    "r4_event_loop_stalls_total",
    "r4_event_loop_stall_seconds",
)
#: Series only a cluster-wide (redis) bulkhead exports: tests/test_control.py scrapes them against real Redis.
CLUSTER_ONLY = {"r4_bulkhead_cluster_concurrent_calls", "r4_bulkhead_cluster_expired_leases", "r4_bulkhead_lost_leases_total"}
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
    rows = [line for line in _reference().splitlines() if line.startswith(f"| `{metric}`")]
    assert len(rows) == 1, metric
    cells = [c.strip() for c in re.split(r"(?<!\\)\|", rows[0].strip().strip("|"))]  # "\|" is a literal pipe
    assert len(cells) == 4 and all(cells), rows[0]  # series, type, labels, meaning
    assert "`name`" in cells[2]


# ----------------------------------------------------------------------------- guide vs. a live scrape

EVERY_PRIMITIVE = {
    "ratelimiters": {
        "configs": {"default": {"limit_refresh_period": "60s"}},
        "instances": {
            "api": {"limit_for_period": 10},
            "per_ip": {"limit_for_period": 2, "key": "ip"},
        },
    },
    "bulkheads": {"instances": {"db": {"max_concurrent_calls": 2}}},
    "circuitbreakers": {"instances": {"payments": {}}},
    "retries": {"instances": {"payments": {"max_attempts": 2, "budget": "payments"}}},
    "retry_budgets": {"payments": {}},
    "adaptivethrottlers": {"instances": {"payments": {}}},
    "timelimiters": {"instances": {"payments": {"timeout_duration": "1s"}}},
}


def _guide() -> str:
    return (DOCS / "operations.md").read_text(encoding="utf-8")


def _reference() -> str:
    """The per-primitive series tables of operations.md (section 1, before the multi-worker notes)."""
    section = _guide().split("## 1. Metrics reference", 1)[1]
    return section.split("### Counters and gauges under multiple workers", 1)[0]


def _rows(text: str, first_cell: str) -> list[list[str]]:
    """The cells of every table row of ``text`` whose first cell is exactly ``first_cell``."""
    out = []
    for line in text.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
            if cells[0] == first_cell:
                out.append(cells)
    return out


@pytest.fixture
def scrape(settings: Any, monkeypatch: pytest.MonkeyPatch, r4_clock: Any) -> dict[str, set[str]]:
    """Documented series name -> label names, from a single-process scrape with every primitive in use."""
    from django_ratelimit_r4 import registry, stall
    from django_ratelimit_r4.contrib import prometheus

    settings.RATELIMIT_R4 = EVERY_PRIMITIVE
    registry.get_keyed_rate_limiter("per_ip").acquire_permission("203.0.113.7")  # a live key
    registry.get_rate_limiter("api").acquire_permission()
    detector = stall.StallDetector(name="asgi")  # never started: its (zero) counters are exported
    monkeypatch.setattr(stall, "get_detectors", lambda: [detector])
    target = CollectorRegistry()
    target.register(prometheus.R4Collector())
    series: dict[str, set[str]] = {}
    for family in target.collect():
        for sample in family.samples:
            # Summaries and histograms are documented by family name (_count/_sum/_bucket are suffixes).
            name = family.name if family.type in ("summary", "histogram") else sample.name
            series.setdefault(name, set()).update(sample.labels)
    return series


def test_the_scrape_covers_every_kind_of_series(scrape: dict[str, set[str]]) -> None:
    # Guards the test below: an empty or partial scrape would document nothing.
    assert len(scrape) >= len(METRICS) - len(CLUSTER_ONLY) + 1, sorted(scrape)
    assert "resilience4j_ratelimiter_keys" in scrape and "r4_event_loop_stall_seconds" in scrape


def test_operations_guide_documents_every_exported_series(scrape: dict[str, set[str]]) -> None:
    """Fails when prometheus.py exports a series (or a label) that operations.md has no row for."""
    tables = _reference()
    for name, labels in sorted(scrape.items()):
        reference = _rows(tables, f"`{name}`")  # series | type | labels | meaning
        assert len(reference) == 1, f"{name} is exported but has no row in the metrics reference"
        assert len(reference[0]) == 4 and all(reference[0]), reference[0]
        for label in labels:
            assert f"`{label}`" in reference[0][2], f"{name}: label {label!r} is not documented"


def test_keyed_instances_export_no_available_permissions(scrape: dict[str, set[str]], settings: Any) -> None:
    """The documented rule, checked on the same configuration the guide's rule talks about."""
    from django_ratelimit_r4.contrib import prometheus

    target = CollectorRegistry()
    target.register(prometheus.R4Collector())
    available = "resilience4j_ratelimiter_available_permissions"
    assert target.get_sample_value(available, {"name": "api"}) == 9.0
    assert target.get_sample_value(available, {"name": "per_ip"}) is None
    assert target.get_sample_value("resilience4j_ratelimiter_keys", {"name": "per_ip"}) == 1.0
    assert "exports no `available_permissions`" in _guide()


def test_multiprocess_table_matches_the_modes_prometheus_uses() -> None:
    """Every gauge of multiprocess mode is in the guide's table, with the mode it is really built with."""
    from django_ratelimit_r4.contrib import prometheus

    syncer = prometheus._Syncer(CollectorRegistry(), 1.0)  # builds the metric objects only (no thread)
    built = {m._name: m._multiprocess_mode for m in syncer.metrics.values() if isinstance(m, Gauge)}
    assert len(built) >= 9
    section = _guide().split("### Gauges under `PROMETHEUS_MULTIPROC_DIR`", 1)[1].split("\n### ", 1)[0]
    documented = {}
    for line in section.splitlines():
        match = re.match(r"\| `(\w+)` \| `(\w+)` \|", line)
        if match:
            documented[match.group(1)] = match.group(2)
    assert documented == built
    for mode in set(built.values()):
        assert mode.startswith("live"), mode  # the table's "live workers" wording depends on it


def test_redis_docs_say_what_is_global_and_what_is_per_process() -> None:
    guide, redis = _guide(), (DOCS / "redis.md").read_text(encoding="utf-8")
    assert "### Which figures are global with Redis" in guide
    assert "## Global state, per-process counters" in redis
    for text in (guide, redis):
        assert "resilience4j_ratelimiter_calls_total" in text and "per process" in text
        assert "max by (name)" in text  # the global gauge must not be summed over workers
