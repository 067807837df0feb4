"""Prometheus metrics for every configured instance, in prometheus_client's default registry.

django-prometheus's ``/metrics`` view (or any exporter of ``prometheus_client.REGISTRY``) shows the
series below. Names are Resilience4j's Micrometer names as Prometheus renders them, so Resilience4j
dashboards keep working. Every series has a ``name`` label (the instance name); client keys of a keyed
limiter never become labels.

==========================================================  =========  =========================  ==========
series                                                      type       extra labels               mp mode
==========================================================  =========  =========================  ==========
``resilience4j_ratelimiter_available_permissions``          gauge                                 liveall
``resilience4j_ratelimiter_waiting_threads``                gauge                                 livesum
``resilience4j_ratelimiter_calls_total``                    counter    ``kind`` successful|failed
``resilience4j_ratelimiter_keys``                           gauge      (keyed limiters only)      livesum
``resilience4j_ratelimiter_lease_batches_total``            counter    (limiters with a lease)
``resilience4j_ratelimiter_lease_permits_total``            counter    ``kind`` (4 kinds)
``resilience4j_bulkhead_available_concurrent_calls``        gauge                                 liveall
``resilience4j_bulkhead_max_allowed_concurrent_calls``      gauge                                 livesum
``r4_bulkhead_cluster_concurrent_calls``                    gauge      (cluster-wide bulkheads)   livemax
``r4_bulkhead_cluster_expired_leases``                      gauge      (cluster-wide bulkheads)   livemax
``r4_bulkhead_lost_leases_total``                           counter    (cluster-wide bulkheads)
``resilience4j_circuitbreaker_state``                       gauge 0/1  ``state`` (6 values)       livemax
``resilience4j_circuitbreaker_failure_rate``                gauge                                 livemax
``resilience4j_circuitbreaker_slow_call_rate``              gauge                                 livemax
``resilience4j_circuitbreaker_buffered_calls``              gauge      ``kind`` successful|failed livesum
``resilience4j_circuitbreaker_calls_seconds``               summary    ``kind`` succ.|failed|ign.
``resilience4j_circuitbreaker_not_permitted_calls_total``   counter
``resilience4j_retry_calls_total``                          counter    ``kind`` (4 outcomes)
``resilience4j_timelimiter_calls_total``                    counter    ``kind`` succ.|failed|timeout
``r4_retry_budget_exhausted_calls_total``                   counter    (retries with a budget)
``r4_retry_budget_balance``                                 gauge      (``name`` = the budget)    liveall
``r4_adaptive_throttler_calls_total``                       counter    ``kind`` acc.|rej.|throttled
``r4_adaptive_throttler_rejection_probability``             gauge                                 livemax
``r4_event_loop_stalls_total``                              counter    (stall detector name)
``r4_event_loop_stall_seconds``                             histogram  ``le``
==========================================================  =========  =========================  ==========

A **keyed** rate limiter (one budget per client) is one series per instance name: ``calls_total`` is
the sum over all keys (plus the instance's shared limiter), ``waiting_threads`` likewise, and
``resilience4j_ratelimiter_keys`` counts the keys currently holding state (clients that used part of
their budget this period, or are in debt). An instance with a ``key`` spec exports **no**
``available_permissions``: there is one value per client, and its shared limiter is not what
requests use, so any single number would mislead.

Two modes, chosen once by :func:`install`:

* **Single process** (no ``PROMETHEUS_MULTIPROC_DIR``): one custom collector, :data:`collector`,
  reads the primitives' plain counters at scrape time. A decision pays nothing for metrics.
* **Multiprocess** (``PROMETHEUS_MULTIPROC_DIR`` set, e.g. gunicorn): prometheus_client ignores custom
  collectors there, so real ``Gauge``/``Counter``/``Summary``/``Histogram`` objects (multiprocess modes
  in the table) are updated by a per-worker daemon thread that every ``interval`` (1 s) reads the same
  counters and pushes counter *deltas* and gauge values. Decisions still pay nothing; values lag by at
  most ``interval``. The thread starts lazily in the worker, on its first request (or the first
  :func:`sync_now`), never in the gunicorn master, and a last sync runs at interpreter exit.
  A circuit breaker's ``state`` gauges are also pushed at each of its transitions, from a
  ``STATE_TRANSITION`` listener (which leaves the breaker's per-call fast path alone; it never waits
  for the syncer), so a scrape sees an opened breaker at once; the syncer is the backstop.
  Stalls are observed from :func:`django_ratelimit_r4.stall.add_stall_listener`.

gunicorn configuration for multiprocess mode (wipe the directory before each start)::

    # gunicorn.conf.py
    from prometheus_client import multiprocess

    def worker_exit(server, worker):          # flush the last interval of this worker
        from django_ratelimit_r4.contrib import prometheus
        prometheus.sync_now()

    def child_exit(server, worker):           # drop the dead worker's live* gauges
        multiprocess.mark_process_dead(worker.pid)

Counters restart from zero when an instance is rebuilt (``override_settings``) or ``reset()``;
Prometheus' ``rate()`` treats that as a counter reset. In multiprocess mode the syncer keeps the
exported counters monotonic: a source whose value went down (or a new instance object) counts from
zero. Like Prometheus itself, it undercounts only if a source is reset *and* climbs past its old
value within one interval. Gauges of an instance removed from the settings keep their last
value until the worker restarts (multiprocess files cannot remove series).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import struct
import threading
import weakref
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import request_started
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, Summary
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    SummaryMetricFamily,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from .. import registry as r4_registry
from .. import state as r4_state
from ..core.backend import HealthReporting, LeaseReporting
from ..core.circuitbreaker import State

try:  # written separately and optional: no stall series without it
    from .. import stall as _stall
except ImportError:  # pragma: no cover - depends on the installation
    _stall = None  # type: ignore[assignment]

__all__ = [
    "DEFAULT_SYNC_INTERVAL_S",
    "MULTIPROCESS",
    "SINGLE_PROCESS",
    "R4Collector",
    "collector",
    "install",
    "installed_mode",
    "multiprocess_requested",
    "sync_now",
    "uninstall",
]

logger = logging.getLogger("django_ratelimit_r4.prometheus")

#: Seconds between two pushes of the multiprocess syncer.
DEFAULT_SYNC_INTERVAL_S = 1.0
#: Values returned by :func:`install` and :func:`installed_mode`.
SINGLE_PROCESS = "single_process"
MULTIPROCESS = "multiprocess"

_NS_PER_S = 1e9


# --------------------------------------------------------------------------------------------------
# The series
# --------------------------------------------------------------------------------------------------


class _Spec(NamedTuple):
    name: str  # family name (counters without the _total prometheus_client appends)
    type: str  # "gauge" | "counter" | "summary"
    doc: str
    labels: tuple[str, ...]
    mode: str = ""  # multiprocess_mode of a gauge


RL_AVAILABLE = _Spec(
    "resilience4j_ratelimiter_available_permissions",
    "gauge",
    "Permissions left in the current refresh period (negative while reservations are outstanding).",
    ("name",),
    "liveall",
)
RL_WAITING = _Spec(
    "resilience4j_ratelimiter_waiting_threads",
    "gauge",
    "Callers waiting for a reserved permission.",
    ("name",),
    "livesum",
)
RL_CALLS = _Spec(
    "resilience4j_ratelimiter_calls",
    "counter",
    "Rate limiter decisions: calls let through (successful) and turned away (failed).",
    ("name", "kind"),
)
RL_KEYS = _Spec(
    "resilience4j_ratelimiter_keys",
    "gauge",
    "Keys of a keyed rate limiter currently holding state (client keys are never labels).",
    ("name",),
    "livesum",
)
RL_BACKEND_FAULTS = _Spec(
    "resilience4j_ratelimiter_backend_fault_decisions",
    "counter",
    "Decisions made by the fault policy because the remote backend (Redis) failed or was cooling down.",
    ("name", "backend"),
)
RL_BACKEND_DEGRADED = _Spec(
    "resilience4j_ratelimiter_backend_degraded",
    "gauge",
    "1 while this process sees the remote backend (Redis) in an outage (decisions use the fault policy).",
    ("name", "backend"),
    "livemax",
)
RL_LEASE_BATCHES = _Spec(
    "resilience4j_ratelimiter_lease_batches",
    "counter",
    "Permit leases (lease option): round trips to Redis that took a batch of permits into this process's lease.",
    ("name",),
)
RL_LEASE_PERMITS = _Spec(
    "resilience4j_ratelimiter_lease_permits",
    "counter",
    "Permit leases (lease option): permits leased beyond the decision's own, spent locally, expired unspent "
    "at their cycle's end, or dropped unspent by reset/drain/change_limit/the keyed table's bound.",
    ("name", "kind"),
)
BH_AVAILABLE = _Spec(
    "resilience4j_bulkhead_available_concurrent_calls",
    "gauge",
    "Concurrent calls that can still start.",
    ("name",),
    "liveall",
)
BH_MAX = _Spec(
    "resilience4j_bulkhead_max_allowed_concurrent_calls",
    "gauge",
    "The configured max_concurrent_calls; for an adaptive bulkhead, its current limit.",
    ("name",),
    "livesum",
)
BH_CLUSTER_CALLS = _Spec(
    "r4_bulkhead_cluster_concurrent_calls",
    "gauge",
    "A cluster-wide (redis) bulkhead's leases alive in the whole cluster (the same value in every worker).",
    ("name",),
    "livemax",
)
BH_CLUSTER_EXPIRED = _Spec(
    "r4_bulkhead_cluster_expired_leases",
    "gauge",
    "A cluster-wide bulkhead's leases ever given back by their TTL, not released (a worker killed or stalled mid-call); "
    "cluster-wide, only grows.",
    ("name",),
    "livemax",
)
BH_LOST_LEASES = _Spec(
    "r4_bulkhead_lost_leases",
    "counter",
    "Calls of this worker whose cluster-wide bulkhead lease expired while they still ran (renewal came too late).",
    ("name",),
)
CB_STATE = _Spec(
    "resilience4j_circuitbreaker_state",
    "gauge",
    "1 for the circuit breaker's current state, 0 for the others.",
    ("name", "state"),
    "livemax",
)
CB_FAILURE_RATE = _Spec(
    "resilience4j_circuitbreaker_failure_rate",
    "gauge",
    "Failed calls in percent of the sliding window; -1 below minimum_number_of_calls.",
    ("name",),
    "livemax",
)
CB_SLOW_RATE = _Spec(
    "resilience4j_circuitbreaker_slow_call_rate",
    "gauge",
    "Slow calls in percent of the sliding window; -1 below minimum_number_of_calls.",
    ("name",),
    "livemax",
)
CB_BUFFERED = _Spec(
    "resilience4j_circuitbreaker_buffered_calls",
    "gauge",
    "Outcomes currently held in the sliding window.",
    ("name", "kind"),
    "livesum",
)
CB_BACKEND_DEGRADED = _Spec(
    "resilience4j_circuitbreaker_backend_degraded",
    "gauge",
    "1 while a cluster-wide circuit breaker cannot reach Redis and this process decides alone (local fallback).",
    ("name",),
    "livemax",
)
CB_CALLS = _Spec(
    "resilience4j_circuitbreaker_calls_seconds",
    "summary",
    "Calls the circuit breaker let through, by outcome, and their total duration.",
    ("name", "kind"),
)
CB_NOT_PERMITTED = _Spec(
    "resilience4j_circuitbreaker_not_permitted_calls",
    "counter",
    "Calls refused because the circuit breaker was open, forced open or out of half-open probes.",
    ("name",),
)
RETRY_CALLS = _Spec(
    "resilience4j_retry_calls",
    "counter",
    "Logical calls through a retry, by outcome.",
    ("name", "kind"),
)
RETRY_BUDGET_EXHAUSTED = _Spec(
    "r4_retry_budget_exhausted_calls",
    "counter",
    "Calls of a retry that failed early because its retry budget refused a retry.",
    ("name",),
)
RETRY_BUDGET_BALANCE = _Spec(
    "r4_retry_budget_balance",
    "gauge",
    "Retries a retry budget would allow right now (its name is the label).",
    ("name",),
    "liveall",
)
AT_CALLS = _Spec(
    "r4_adaptive_throttler_calls",
    "counter",
    "Calls through an adaptive throttler: accepted or rejected by the backend, or throttled locally.",
    ("name", "kind"),
)
AT_PROBABILITY = _Spec(
    "r4_adaptive_throttler_rejection_probability",
    "gauge",
    "The probability an adaptive throttler rejects the next call locally: max(0, (requests - k*accepts) / (requests + 1)).",
    ("name",),
    "livemax",
)
TL_CALLS = _Spec(
    "resilience4j_timelimiter_calls",
    "counter",
    "Calls through a time limiter, by outcome.",
    ("name", "kind"),
)
STALLS = _Spec(
    "r4_event_loop_stalls",
    "counter",
    "Times the event loop was blocked longer than the stall detector's threshold.",
    ("name",),
)
STALL_SECONDS_NAME = "r4_event_loop_stall_seconds"
STALL_SECONDS_DOC = "How long each event-loop stall lasted."

#: ``kind`` label values (outcomes) of :data:`RL_LEASE_PERMITS` (``<outcome>_permits`` of the lease snapshot).
_LEASE_OUTCOMES = ("leased", "spent", "expired", "dropped")

_SPECS: tuple[_Spec, ...] = (
    RL_AVAILABLE,
    RL_WAITING,
    RL_CALLS,
    RL_KEYS,
    RL_BACKEND_FAULTS,
    RL_BACKEND_DEGRADED,
    RL_LEASE_BATCHES,
    RL_LEASE_PERMITS,
    BH_AVAILABLE,
    BH_MAX,
    BH_CLUSTER_CALLS,
    BH_CLUSTER_EXPIRED,
    BH_LOST_LEASES,
    CB_STATE,
    CB_FAILURE_RATE,
    CB_SLOW_RATE,
    CB_BUFFERED,
    CB_BACKEND_DEGRADED,
    CB_CALLS,
    CB_NOT_PERMITTED,
    RETRY_CALLS,
    RETRY_BUDGET_EXHAUSTED,
    RETRY_BUDGET_BALANCE,
    TL_CALLS,
    AT_CALLS,
    AT_PROBABILITY,
)

#: ``(label value, State)`` in Resilience4j's order: lower-cased state names.
_STATES: tuple[tuple[str, State], ...] = tuple((s.name.lower(), s) for s in State)
_RETRY_OUTCOMES = (
    ("successful_without_retry", "number_of_successful_calls_without_retry_attempt"),
    ("successful_with_retry", "number_of_successful_calls_with_retry_attempt"),
    ("failed_with_retry", "number_of_failed_calls_with_retry_attempt"),
    ("failed_without_retry", "number_of_failed_calls_without_retry_attempt"),
)
_AT_OUTCOMES = (
    ("accepted", "number_of_accepted_calls"),
    ("rejected", "number_of_rejected_calls"),
    ("throttled", "number_of_throttled_calls"),
)
_TL_OUTCOMES = (
    ("successful", "number_of_successful_calls"),
    ("failed", "number_of_failed_calls"),
    ("timeout", "number_of_timeout_calls"),
)


# --------------------------------------------------------------------------------------------------
# Reading the primitives (shared by both modes, so they always agree)
# --------------------------------------------------------------------------------------------------

Labels = tuple[str, ...]


class _Reading:
    """One pass over every configured instance.

    Counters are reported per *source* (``slot`` + the object that owns the number) so the
    multiprocess syncer can compute deltas even when one of two summed sources restarts.
    """

    __slots__ = ("counters", "gauges", "summaries")

    def __init__(self) -> None:
        self.gauges: list[tuple[_Spec, Labels, float]] = []
        self.counters: list[tuple[_Spec, Labels, str, object, int]] = []
        # (spec, labels, source, count, duration in ns)
        self.summaries: list[tuple[_Spec, Labels, object, int, int]] = []


def _each(section: str) -> Iterator[tuple[str, Any]]:
    """``registry.instances(section)``, except that an instance that cannot be built is logged and left out:
    one instance never hides the others from a scrape (misconfigured ones are skipped, as ``check`` reports
    them)."""
    for name in r4_registry.names(section):
        try:
            yield name, r4_registry.lookup(section, name)[1]
        except ImproperlyConfigured:
            continue
        except Exception as exc:
            logger.warning("r4 metrics of %s %r left out of this scrape: %r", section, name, exc)


@contextlib.contextmanager
def _isolated(out: _Reading, section: str, name: str) -> Iterator[None]:
    """Read one instance into ``out``: all of its series, or (when reading it fails) none, with a warning."""
    marks = len(out.gauges), len(out.counters), len(out.summaries)
    try:
        yield
    except Exception as exc:
        del out.gauges[marks[0] :], out.counters[marks[1] :], out.summaries[marks[2] :]
        logger.warning("r4 metrics of %s %r left out of this scrape: %r", section, name, exc)


def _read(out: _Reading) -> None:
    """Append the current value of every series of every configured instance to ``out``."""
    gauge, counter = out.gauges.append, out.counters.append
    keyed, unbuilt = r4_state.keyed_stores()
    for name, rl in _each("ratelimiters"):
        with _isolated(out, "ratelimiters", name):
            if name in unbuilt:
                raise unbuilt[name]
            m = rl.metrics
            waiting = m.number_of_waiting_threads
            counter((RL_CALLS, (name, "successful"), "shared", rl, m.successful_calls))
            counter((RL_CALLS, (name, "failed"), "shared", rl, m.failed_calls))
            k = keyed.get(name)
            if k is None or r4_registry.instance_options("ratelimiters", name)["key"] is None:
                gauge((RL_AVAILABLE, (name,), m.available_permissions))
            if k is not None:
                km = k.metrics
                waiting += km.number_of_waiting_threads
                counter((RL_CALLS, (name, "successful"), "keyed", k, km.successful_calls))
                counter((RL_CALLS, (name, "failed"), "keyed", k, km.failed_calls))
                live = km.live_keys
                if live is not None and live >= 0:  # Redis cannot count its keys cheaply: no series then
                    gauge((RL_KEYS, (name,), live))
            gauge((RL_WAITING, (name,), waiting))
            degraded = None
            keyed_store = k.store if k is not None else None
            for owner, source in (("shared", rl.backend), ("keyed", keyed_store)):
                if isinstance(source, HealthReporting):  # a remote backend (Redis): plain reads, no round trip
                    health = source.backend_health()
                    if degraded is None:  # the alias in RATELIMIT_R4["backends"] (the shorthand: "default")
                        alias = str(r4_registry.instance_options("ratelimiters", name)["backend"])
                    counter((RL_BACKEND_FAULTS, (name, alias), owner, source, health["fault_decisions"]))
                    degraded = bool(degraded) or health["degraded"]
            if degraded is not None:
                gauge((RL_BACKEND_DEGRADED, (name, alias), 1.0 if degraded else 0.0))
            for owner, source in (("shared", rl.backend), ("keyed", keyed_store)):
                if isinstance(source, LeaseReporting):  # permit leases: this process's plain counters, no round trip
                    lease = source.lease_snapshot()
                    counter((RL_LEASE_BATCHES, (name,), owner, source, lease["batches"]))
                    for outcome in _LEASE_OUTCOMES:
                        counter((RL_LEASE_PERMITS, (name, outcome), owner, source, lease[f"{outcome}_permits"]))

    for name, bh in _each("bulkheads"):
        with _isolated(out, "bulkheads", name):
            m = bh.metrics
            counts = r4_state.cluster_counts(bh)
            if counts is not None:  # cluster-wide (redis): one round trip per read, the cached count on a fault
                in_flight, expired = counts
                gauge((BH_CLUSTER_CALLS, (name,), in_flight))
                if expired is not None:
                    gauge((BH_CLUSTER_EXPIRED, (name,), expired))
                counter((BH_LOST_LEASES, (name,), "", bh, m.lost_leases))
                gauge((BH_AVAILABLE, (name,), max(0, m.max_allowed_concurrent_calls - in_flight)))
            else:
                gauge((BH_AVAILABLE, (name,), m.available_concurrent_calls))
            gauge((BH_MAX, (name,), m.max_allowed_concurrent_calls))

    for name, cb in _each("circuitbreakers"):
        with _isolated(out, "circuitbreakers", name):
            current = cb.state  # applies automatic transitions that fell due
            for label, state in _STATES:
                gauge((CB_STATE, (name, label), 1.0 if state is current else 0.0))
            m = cb.metrics
            gauge((CB_FAILURE_RATE, (name,), m.failure_rate))
            gauge((CB_SLOW_RATE, (name,), m.slow_call_rate))
            gauge((CB_BUFFERED, (name, "successful"), m.number_of_successful_calls))
            gauge((CB_BUFFERED, (name, "failed"), m.number_of_failed_calls))
            if getattr(cb, "shared_health", None) is not None:  # cluster-wide: 1 while it decides alone
                gauge((CB_BACKEND_DEGRADED, (name,), 1.0 if cb.degraded else 0.0))
            out.summaries.append(
                (CB_CALLS, (name, "successful"), cb, m.total_successful_calls, m.total_successful_duration_ns)
            )
            out.summaries.append(
                (CB_CALLS, (name, "failed"), cb, m.total_failed_calls, m.total_failed_duration_ns)
            )
            out.summaries.append(
                (CB_CALLS, (name, "ignored"), cb, m.total_ignored_calls, m.total_ignored_duration_ns)
            )
            counter((CB_NOT_PERMITTED, (name,), "", cb, m.total_not_permitted_calls))

    for name, retry in _each("retries"):
        with _isolated(out, "retries", name):
            m = retry.metrics
            for outcome, attr in _RETRY_OUTCOMES:
                counter((RETRY_CALLS, (name, outcome), "", retry, getattr(m, attr)))
            if retry.budget is not None:
                counter((RETRY_BUDGET_EXHAUSTED, (name,), "", retry, m.number_of_budget_exhausted_calls))

    for name, budget in r4_registry.retry_budgets():
        gauge((RETRY_BUDGET_BALANCE, (name,), budget.balance))

    for name, tl in _each("timelimiters"):
        with _isolated(out, "timelimiters", name):
            m = tl.metrics
            for outcome, attr in _TL_OUTCOMES:
                counter((TL_CALLS, (name, outcome), "", tl, getattr(m, attr)))

    for name, throttler in _each("adaptivethrottlers"):
        with _isolated(out, "adaptivethrottlers", name):
            m = throttler.metrics
            for outcome, attr in _AT_OUTCOMES:
                counter((AT_CALLS, (name, outcome), "", throttler, getattr(m, attr)))
            gauge((AT_PROBABILITY, (name,), m.rejection_probability))


def _stall_families() -> Iterator[Metric]:
    """Stall series from the running detectors, summed per detector name."""
    if _stall is None:
        return
    detectors = _stall.get_detectors()
    if not detectors:
        return
    bounds = (*_stall.STALL_BUCKETS, float("inf"))
    per_name: dict[str, tuple[list[int], float]] = {}
    for d in detectors:
        snap = d.snapshot()
        counts, total_s = per_name.get(d.name, ([0] * len(bounds), 0.0))
        for i, c in enumerate(snap.bucket_counts):
            counts[i] += c
        per_name[d.name] = (counts, total_s + snap.stall_seconds_total)
    stalls = CounterMetricFamily(STALLS.name, STALLS.doc, labels=STALLS.labels)
    seconds = HistogramMetricFamily(STALL_SECONDS_NAME, STALL_SECONDS_DOC, labels=("name",))
    for name, (counts, total_s) in per_name.items():
        cumulative, running = [], 0
        for bound, c in zip(bounds, counts, strict=True):
            running += c
            cumulative.append((_le(bound), running))
        stalls.add_metric((name,), running)
        seconds.add_metric((name,), cumulative, total_s)
    yield stalls
    yield seconds


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


# --------------------------------------------------------------------------------------------------
# Single process: a collector read at scrape time
# --------------------------------------------------------------------------------------------------


def _family(spec: _Spec) -> Any:
    if spec.type == "gauge":
        return GaugeMetricFamily(spec.name, spec.doc, labels=spec.labels)
    if spec.type == "counter":
        return CounterMetricFamily(spec.name, spec.doc, labels=spec.labels)
    return SummaryMetricFamily(spec.name, spec.doc, labels=spec.labels)


class R4Collector(Collector):
    """Reads every configured instance's counters when Prometheus scrapes; costs nothing in between.

    ``collect()`` never raises: a broken ``RATELIMIT_R4`` must not take the whole ``/metrics`` page
    down with it, so the failure is logged and the r4 series are left out of that scrape.
    """

    def describe(self) -> Iterable[Metric]:
        """The families without samples, so registering never builds instances or reads settings."""
        families = [_family(spec) for spec in _SPECS]
        if _stall is not None:
            families.append(CounterMetricFamily(STALLS.name, STALLS.doc, labels=STALLS.labels))
            families.append(HistogramMetricFamily(STALL_SECONDS_NAME, STALL_SECONDS_DOC, labels=("name",)))
        return families

    def collect(self) -> Iterable[Metric]:
        """One family per series with a sample per instance (and per ``kind``/``state`` label)."""
        reading = _Reading()
        try:
            _read(reading)
        except Exception:
            logger.exception(
                "django-ratelimit-r4 metrics could not be read; r4 series left out of this scrape"
            )
            return []
        families = {spec: _family(spec) for spec in _SPECS}
        for spec, labels, value in reading.gauges:
            families[spec].add_metric(labels, value)
        summed: dict[tuple[_Spec, Labels], int] = {}
        for spec, labels, _slot, _source, value in reading.counters:
            summed[spec, labels] = summed.get((spec, labels), 0) + value
        for (spec, labels), value in summed.items():
            families[spec].add_metric(labels, value)
        for spec, labels, _source, count, duration_ns in reading.summaries:
            families[spec].add_metric(labels, count_value=count, sum_value=duration_ns / _NS_PER_S)
        result: list[Metric] = [f for f in families.values() if f.samples]
        try:
            result.extend(_stall_families())
        except Exception:
            logger.exception("event-loop stall metrics could not be read")
        return result


#: The single-process collector; :func:`install` registers it with ``prometheus_client.REGISTRY``.
collector = R4Collector()


# --------------------------------------------------------------------------------------------------
# Multiprocess: real metric objects fed by a per-worker syncer
# --------------------------------------------------------------------------------------------------


class _StateWatch:
    """A breaker's ``STATE_TRANSITION`` listener: queue its state gauges for a push, push if nobody is.

    Holds the breaker weakly (the syncer's ``WeakKeyDictionary`` maps breaker -> watch) and the registry
    generation it was built for: a breaker of a replaced setting pushes nothing.
    """

    __slots__ = ("__weakref__", "breaker", "generation", "name", "syncer")

    def __init__(self, syncer: _Syncer, name: str, breaker: Any, generation: int) -> None:
        self.syncer = syncer
        self.name = name
        self.breaker = weakref.ref(breaker)
        self.generation = generation

    def __call__(self, event: Any) -> None:
        syncer = self.syncer
        syncer._pending[self] = None
        syncer._drain_states()


class _Syncer:
    """Pushes the primitives' numbers into multiprocess-safe metric objects, every ``interval``."""

    def __init__(self, registry: CollectorRegistry | None, interval: float) -> None:
        self.interval = interval
        self.registry = registry
        self.metrics: dict[_Spec, Any] = {}
        for spec in _SPECS:
            if spec.type == "gauge":
                mode: Any = spec.mode  # one of prometheus_client's Literal modes, checked by Gauge
                metric: Any = Gauge(
                    spec.name, spec.doc, spec.labels, registry=registry, multiprocess_mode=mode
                )
            elif spec.type == "counter":
                metric = Counter(spec.name, spec.doc, spec.labels, registry=registry)
            else:
                metric = Summary(spec.name, spec.doc, spec.labels, registry=registry)
            self.metrics[spec] = metric
        self.stalls: Counter | None = None
        self.stall_seconds: Histogram | None = None
        if _stall is not None:
            self.stalls = Counter(STALLS.name, STALLS.doc, STALLS.labels, registry=registry)
            self.stall_seconds = Histogram(
                STALL_SECONDS_NAME,
                STALL_SECONDS_DOC,
                ("name",),
                registry=registry,
                buckets=_stall.STALL_BUCKETS,
            )
        #: breaker -> its transition listener (weak keys: a breaker of a replaced setting goes away).
        self._watched: weakref.WeakKeyDictionary[Any, _StateWatch] = weakref.WeakKeyDictionary()
        self._after_fork()
        # Survive the process: counters already pushed by the parent stay the parent's.
        self._last: dict[tuple[_Spec, Labels, str], tuple[object, int]] = {}
        self._gauges: dict[tuple[_Spec, Labels], float] = {}
        self._children: dict[tuple[_Spec, Labels], Any] = {}

    def _after_fork(self) -> None:
        # Locks held by a thread of the parent at fork time would stay locked forever in the child.
        self._lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._watch_lock = threading.Lock()
        #: Breakers whose state gauges a transition asked to push (insertion-ordered set).
        self._pending: dict[_StateWatch, None] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

    # -- pushing -------------------------------------------------------------------------------------

    def _child(self, spec: _Spec, labels: Labels) -> Any:
        child = self._children.get((spec, labels))
        if child is None:
            child = self._children[spec, labels] = self.metrics[spec].labels(*labels)
        return child

    def _delta(self, key: tuple[_Spec, Labels, str], source: object, value: int) -> int:
        last = self._last.get(key)
        self._last[key] = (source, value)
        if last is None or last[0] is not source or value < last[1]:
            return value  # a new (rebuilt) or reset source counts from zero
        return value - last[1]

    def _set_gauge_locked(self, spec: _Spec, labels: Labels, value: float) -> None:
        gauges = self._gauges
        if gauges.get((spec, labels)) != value:
            gauges[spec, labels] = value
            self._child(spec, labels).set(value)

    def sync(self) -> None:
        """Read every instance once and push gauge values and counter deltas."""
        reading = _Reading()
        with self._lock:  # read under the lock too: an older reading applied late would look like a reset
            _read(reading)
            for spec, labels, value in reading.gauges:
                self._set_gauge_locked(spec, labels, value)
            for spec, labels, slot, source, value in reading.counters:
                delta = self._delta((spec, labels, slot), source, value)
                if delta:
                    self._child(spec, labels).inc(delta)
            for spec, labels, source, count, duration_ns in reading.summaries:
                delta_count = self._delta((spec, labels, "count"), source, count)
                delta_ns = self._delta((spec, labels, "sum"), source, duration_ns)
                if delta_count or delta_ns:
                    # Summary has no public "add n observations"; its two values are stable API in practice.
                    child = self._child(spec, labels)
                    child._count.inc(delta_count)
                    child._sum.inc(delta_ns / _NS_PER_S)
            # After the reading: a transition queued while reading must win over the older state read.
            self._push_states_locked()
        self._drain_states()

    # -- breaker state at each transition ------------------------------------------------------------

    def watch(self, name: str, breaker: Any) -> None:
        """Push ``breaker``'s ``state`` gauges at each of its transitions (idempotent).

        A ``STATE_TRANSITION`` listener does not make the breaker build per-call events.
        """
        with self._watch_lock:
            if breaker in self._watched:
                return
            listener = self._watched[breaker] = _StateWatch(self, name, breaker, r4_registry.generation)
        breaker.events.on_state_transition(listener)

    def watch_all(self) -> None:
        """:meth:`watch` every configured breaker, building it if needed (the build hook watches later ones)."""
        for name, breaker in r4_registry.instances("circuitbreakers"):
            self.watch(name, breaker)

    def unwatch(self) -> None:
        """Remove every transition listener :meth:`watch` added (for :func:`uninstall`)."""
        with self._watch_lock:
            watched = list(self._watched.items())
            self._watched.clear()
        for breaker, listener in watched:
            breaker.events.remove_listener(listener)

    def _drain_states(self) -> None:
        # Whoever holds the lock pushes; a transition never waits for a running sync. The holder looks
        # again after releasing, so a transition queued meanwhile is not left for the next interval.
        lock = self._lock
        while self._pending and lock.acquire(blocking=False):
            try:
                self._push_states_locked()
            finally:
                lock.release()

    def _push_states_locked(self) -> None:
        pending = self._pending
        while pending:
            watch, _ = pending.popitem()
            breaker = watch.breaker()
            if breaker is None or watch.generation != r4_registry.generation:
                continue  # a replaced setting's breaker: the current one is what the gauges describe
            # The current state, not the event's: events of two racing transitions may arrive swapped.
            # Reading it can fire a due transition, whose listener just queues again for this loop.
            current = breaker.state
            for label, state in _STATES:
                self._set_gauge_locked(CB_STATE, (watch.name, label), 1.0 if state is current else 0.0)

    def observe_stall(self, event: Any) -> None:
        """Stall listener: one observation per stall, from the detector's watchdog thread."""
        if self.stalls is not None and self.stall_seconds is not None:
            self.stalls.labels(event.name).inc()
            self.stall_seconds.labels(event.name).observe(event.duration_s)

    # -- the thread ----------------------------------------------------------------------------------

    def ensure_started(self) -> None:
        """Start the daemon thread in this process if it is not running yet."""
        if self._thread is not None:
            return
        with self._start_lock:
            if self._thread is None and not self._stop.is_set():
                thread = threading.Thread(target=self._run, name="r4-prometheus-sync", daemon=True)
                thread.start()
                self._thread = thread

    def _run(self) -> None:
        try:  # breakers built before install() never met the build hook
            self.watch_all()
        except Exception:
            logger.exception("django-ratelimit-r4: circuit breaker states will be pushed by the syncer only")
        while not self._stop.wait(self.interval):
            self.sync_logged()

    def sync_logged(self) -> None:
        """:meth:`sync`, logging the first failure of a streak instead of raising."""
        try:
            self.sync()
        except Exception:
            if not self._failing:
                logger.exception("django-ratelimit-r4 metrics sync failed (repeats are not logged)")
            self._failing = True
        else:
            self._failing = False

    def stop(self) -> None:
        """Stop the thread (for :func:`uninstall`)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(5.0)

    @property
    def running(self) -> bool:
        """True while this process's sync thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def unregister(self) -> None:
        """Remove the metric objects from the registry they were registered in."""
        if self.registry is None:
            return
        objects: list[Any] = list(self.metrics.values())
        objects += [m for m in (self.stalls, self.stall_seconds) if m is not None]
        for metric in objects:
            with contextlib.suppress(KeyError):
                self.registry.unregister(metric)


# --------------------------------------------------------------------------------------------------
# Installation
# --------------------------------------------------------------------------------------------------

_install_lock = threading.Lock()
_mode: str | None = None
_registry: CollectorRegistry | None = None
_syncer: _Syncer | None = None
_atexit_registered = False
_FIRST_REQUEST_UID = "django_ratelimit_r4.prometheus.first_request"


def multiprocess_requested() -> bool:
    """True when prometheus_client runs in multiprocess mode (``PROMETHEUS_MULTIPROC_DIR`` is set)."""
    return "PROMETHEUS_MULTIPROC_DIR" in os.environ or "prometheus_multiproc_dir" in os.environ


def _tolerate_empty_metric_files() -> None:
    """Read a multiprocess metric file that is still empty as no samples (idempotent).

    prometheus/client_python#1199 (open in 0.26): ``MmapedDict`` creates a worker's file, then sizes it, and a
    scrape that globs it in between raised ``struct.error``: ``/metrics`` answered 500, for good if the worker
    died in that window. Our syncer creates such files while the workers serve. The eager header read is the
    only place an empty file fails, so that error alone means "nothing written yet" (the upstream fix's reading,
    PR #1207); a corrupt file still raises from the lazy read of its values.
    """
    from prometheus_client.mmap_dict import MmapedDict

    original = MmapedDict.__dict__["read_all_values_from_file"].__func__
    if getattr(original, "_r4_tolerant", False):
        return

    def read_all_values_from_file(filename: str) -> Iterator[Any]:
        try:
            return original(filename)  # type: ignore[no-any-return]
        except struct.error:
            return iter(())

    read_all_values_from_file._r4_tolerant = True  # type: ignore[attr-defined]
    MmapedDict.read_all_values_from_file = staticmethod(read_all_values_from_file)  # type: ignore[method-assign]


def install(
    *,
    registry: CollectorRegistry | None = REGISTRY,
    multiprocess: bool | None = None,
    interval: float = DEFAULT_SYNC_INTERVAL_S,
) -> str:
    """Export r4's metrics; returns :data:`SINGLE_PROCESS` or :data:`MULTIPROCESS`. Idempotent.

    Call it once per process, from ``AppConfig.ready()`` (it reads no settings and builds no
    instance). A second call returns the mode already installed and changes nothing.

    :param registry: where the collector (single process) or metric objects (multiprocess) are
        registered; the default is prometheus_client's global ``REGISTRY``.
    :param multiprocess: force a mode; ``None`` follows :func:`multiprocess_requested`.
    :param interval: seconds between the multiprocess syncer's pushes.
    """
    global _mode, _registry, _syncer, _atexit_registered
    with _install_lock:
        if _mode is not None:
            return _mode
        if multiprocess is None:
            multiprocess = multiprocess_requested()
        if not multiprocess:
            if registry is not None:
                registry.register(collector)
            _registry, _mode = registry, SINGLE_PROCESS
            return _mode
        if not interval > 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval!r}")
        _tolerate_empty_metric_files()
        syncer = _Syncer(registry, interval)
        if _stall is not None:
            _stall.add_stall_listener(syncer.observe_stall)
        # Started by the worker's first request, so a preloading gunicorn master never runs it.
        request_started.connect(_on_first_request, weak=False, dispatch_uid=_FIRST_REQUEST_UID)
        if _on_build not in r4_registry.build_callbacks:
            r4_registry.build_callbacks.append(_on_build)
        if not _atexit_registered:
            atexit.register(_flush_at_exit)
            _atexit_registered = True
        _syncer, _registry, _mode = syncer, registry, MULTIPROCESS
        return _mode


def installed_mode() -> str | None:
    """The mode :func:`install` chose, or ``None`` before it ran (or after :func:`uninstall`)."""
    return _mode


def sync_now() -> None:
    """Multiprocess mode: push this process's numbers now and make sure the syncer runs.

    For tests and gunicorn's ``worker_exit`` hook. A no-op in single-process mode (the collector
    reads at scrape time) and before :func:`install`.
    """
    syncer = _syncer
    if syncer is None:
        return
    syncer.ensure_started()
    syncer.sync()


def uninstall() -> None:
    """Undo :func:`install` (for tests): unregister everything and stop the syncer thread."""
    global _mode, _registry, _syncer
    with _install_lock:
        if _mode == SINGLE_PROCESS and _registry is not None:
            with contextlib.suppress(KeyError):
                _registry.unregister(collector)
        syncer = _syncer
        if syncer is not None:
            request_started.disconnect(dispatch_uid=_FIRST_REQUEST_UID)
            with contextlib.suppress(ValueError):
                r4_registry.build_callbacks.remove(_on_build)
            if _stall is not None:
                _stall.remove_stall_listener(syncer.observe_stall)
            syncer.stop()
            syncer.unwatch()
            syncer.unregister()
        _mode = _registry = _syncer = None


def _on_build(section: str, name: str, instance: Any) -> None:
    # Registry build hook (under its lock; must be quick and never raise): watch new breakers at once.
    syncer = _syncer
    if syncer is not None and section == "circuitbreakers":
        try:
            syncer.watch(name, instance)
        except Exception:
            logger.exception("could not watch circuit breaker %r for state metrics", name)


def _on_first_request(**kwargs: Any) -> None:
    # Disconnect first: afterwards requests pay nothing for metrics.
    request_started.disconnect(dispatch_uid=_FIRST_REQUEST_UID)
    syncer = _syncer
    if syncer is not None:
        syncer.ensure_started()


def _flush_at_exit() -> None:
    syncer = _syncer
    if syncer is not None and syncer._thread is not None:  # only workers that ran the syncer
        syncer.sync_logged()


def _after_fork_in_child() -> None:
    syncer = _syncer
    if syncer is None:
        return
    started_in_parent = syncer._thread is not None
    syncer._after_fork()
    if started_in_parent:  # the parent consumed its first-request trigger; this process needs one
        request_started.connect(_on_first_request, weak=False, dispatch_uid=_FIRST_REQUEST_UID)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
