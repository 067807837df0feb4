"""``manage.py r4``: show and steer the rate limiters, bulkheads, breakers, retries and time limiters.

::

    manage.py r4 status [NAME ...] [--json] [--keys] [--watch SECONDS] [REMOTE]
    manage.py r4 reset NAME [--key KEY] [--timeout SECONDS] [REMOTE]
    manage.py r4 drain NAME [--key KEY] [--timeout SECONDS] [REMOTE]
    manage.py r4 transition NAME --to STATE [--timeout SECONDS] [REMOTE]

    REMOTE: --url URL [--token TOKEN] [--allow-insecure-http]

NAME may be qualified with its type (``circuitbreaker:payments``) when several types share it.

Without ``--url`` the command reads the instances of *its own process*. With the in-memory backend
that is a fresh copy, not the server's state, and the command says so on stderr. ``--url`` points it
at a running server's state endpoint (``django_ratelimit_r4.urls``) instead, authenticating with a
bearer token from ``--token``, ``$R4_STATE_ENDPOINT_TOKEN`` or ``RATELIMIT_R4["state_endpoint_token"]``.
The answer then comes from whichever worker served the request, and the command names it (host, pid):
without a control plane an action changes that worker only, and the command says so.

With ``RATELIMIT_R4["control"]`` (a shared redis backend, :mod:`django_ratelimit_r4.control`), ``status``
lists every live worker with totals over them, and ``reset`` / ``drain`` / ``transition`` reach every worker and
report who acknowledged within ``--timeout`` (and who did not: the command then fails), locally or via ``--url``.

The token goes to ``--url`` and nowhere else: a redirect is never followed (the command fails and
names the ``Location``), and plain ``http://`` is refused for a host other than loopback
(127.0.0.0/8, ``::1``, ``localhost``) unless ``--allow-insecure-http`` says the operator means it.
"""

from __future__ import annotations

import ipaddress
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from argparse import ArgumentParser, ArgumentTypeError
from collections.abc import Sequence
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from django_ratelimit_r4 import conf, control, state
from django_ratelimit_r4.backends.base import redact_url

#: Environment variable read for the bearer token when ``--token`` is not given.
TOKEN_ENV = "R4_STATE_ENDPOINT_TOKEN"
#: Seconds to wait for the state endpoint.
HTTP_TIMEOUT = 10.0
#: The longest ``--timeout`` an action may wait for the workers' acknowledgements (seconds).
MAX_WAIT_S = control.MAX_TIMEOUT_S
#: Clears the terminal between ``--watch`` frames (cursor home + erase display).
CLEAR = "\x1b[H\x1b[2J"

# Indirection so tests can stop --watch without sleeping.
sleep = time.sleep


#: The longest ``--watch`` interval (a day): time.sleep() overflows on inf or 1e12.
MAX_WATCH_S = 86_400.0
#: The shortest ``--watch`` interval: shorter redraws in a busy loop (with ``--url``, a flood of requests).
MIN_WATCH_S = 0.1


def _positive_seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise ArgumentTypeError(f"expected a number of seconds, got {value!r}") from None
    if not seconds > 0:
        raise ArgumentTypeError(f"must be more than 0 seconds, got {value!r}")
    if seconds < MIN_WATCH_S:
        raise ArgumentTypeError(f"must be at least {MIN_WATCH_S:g} seconds, got {value!r}")
    if not seconds <= MAX_WATCH_S:
        raise ArgumentTypeError(f"must be at most {MAX_WATCH_S:g} seconds, got {value!r}")
    return seconds


def _wait_seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise ArgumentTypeError(f"expected a number of seconds, got {value!r}") from None
    if not 0 <= seconds <= MAX_WAIT_S:
        raise ArgumentTypeError(f"must be from 0 to {MAX_WAIT_S:g} seconds, got {value!r}")
    return seconds


# ------------------------------------------------------------------------------------ formatting


def human_ns(nanos: int | None) -> str:
    """``850000000`` -> ``"850ms"``, ``1500000000`` -> ``"1.5s"``; ``0`` -> ``"0"``; None -> ``"-"``."""
    if nanos is None:
        return "-"
    if nanos == 0:
        return "0"
    for size, unit in (
        (86_400_000_000_000, "d"),
        (3_600_000_000_000, "h"),
        (60_000_000_000, "m"),
        (1_000_000_000, "s"),
        (1_000_000, "ms"),
        (1_000, "us"),
    ):
        if abs(nanos) >= size:
            return f"{nanos / size:.3g}{unit}"
    return f"{nanos}ns"


def _rate(value: float) -> str:
    return "-" if value < 0 else f"{value:.1f}%"


def _table(headers: Sequence[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    return [line(headers), *(line(r) for r in rows)]


def _row(item: dict[str, Any], width: int) -> list[str]:
    c, s, type_name = item["config"], item["state"], item["type"]
    if s is None:  # this instance could not be read (the snapshot has its error); the others still show
        return [item["name"], "ERROR", *[""] * (width - 2)]
    if type_name == "ratelimiter":
        keyed = s.get("keyed") or {}
        # A per-client limiter (a `key` spec) has one budget per client: its row adds up the clients'
        # decisions, and "available" only exists per key (`r4 status --json --keys`, the state endpoint).
        per_client = c.get("key") is not None
        live_keys = keyed.get("live_keys", "-")
        return [
            item["name"],
            f"{c['limit_for_period']}/{c['limit_refresh_period']}",
            "per-key" if per_client else str(s["available_permissions"]),
            "-" if per_client else human_ns(s["nanos_to_wait"]),
            str(s["number_of_waiting_threads"] + keyed.get("number_of_waiting_threads", 0)),
            str(s["successful_calls"] + keyed.get("successful_calls", 0)),
            str(s["failed_calls"] + keyed.get("failed_calls", 0)),
            "?" if live_keys is None else str(live_keys),
        ]
    if type_name == "bulkhead":
        cluster = s.get("cluster_concurrent_calls")
        expired = s.get("cluster_expired_leases")
        return [
            item["name"],
            str(s["concurrent_calls"]),
            str(s["max_allowed_concurrent_calls"]),
            str(s["available_concurrent_calls"]),
            str(s["waiting_calls"]),
            str(s["permitted_calls"]),
            str(s["rejected_calls"]),
            "-" if cluster is None else str(cluster),
            "-" if expired is None else str(expired),
        ]
    if type_name == "circuitbreaker":
        states = s.get("states") or {}
        shown = s["state"]
        if shown == "MIXED" and states:  # cluster totals: the workers disagree
            shown = "MIXED(" + ",".join(f"{k}:{v}" for k, v in sorted(states.items())) + ")"
        return [
            item["name"],
            shown,
            _rate(s["failure_rate"]),
            _rate(s["slow_call_rate"]),
            str(s["number_of_buffered_calls"]),
            str(s["total_not_permitted_calls"]),
            human_ns(s["remaining_open_ns"]) if s["remaining_open_ns"] else "-",
        ]
    if type_name == "retry":
        return [
            item["name"],
            str(c["max_attempts"]),
            str(s["number_of_successful_calls_without_retry_attempt"]),
            str(s["number_of_successful_calls_with_retry_attempt"]),
            str(s["number_of_failed_calls_with_retry_attempt"]),
            str(s["number_of_failed_calls_without_retry_attempt"]),
            str(s["number_of_total_calls"]),
        ]
    if type_name == "retrybudget":
        return [
            item["name"],
            f"{c['percent_can_retry']:.0%} + {c['min_retries_per_second']}/s",
            str(c["ttl"]),
            str(s["balance"]),
            str(s["number_of_deposits"]),
            str(s["number_of_retries"]),
            str(s["number_of_refused_retries"]),
        ]
    if type_name == "adaptivethrottler":
        return [
            item["name"],
            str(c["k"]),
            f"{s['requests']}/{s['accepts']}",
            f"{s['rejection_probability']:.0%}",
            str(s["number_of_accepted_calls"]),
            str(s["number_of_rejected_calls"]),
            str(s["number_of_throttled_calls"]),
        ]
    return [
        item["name"],
        str(c["timeout_duration"]),
        str(s["number_of_successful_calls"]),
        str(s["number_of_failed_calls"]),
        str(s["number_of_timeout_calls"]),
    ]


_SECTIONS: list[tuple[str, str, tuple[str, ...]]] = [
    (
        "ratelimiter",
        "Rate limiters",
        ("NAME", "LIMIT", "AVAILABLE", "WAIT", "WAITING", "GRANTED", "REJECTED", "KEYS"),
    ),
    (
        "bulkhead",
        "Bulkheads",
        (
            "NAME",
            "IN USE",
            "MAX",
            "AVAILABLE",
            "WAITING",
            "PERMITTED",
            "REJECTED",
            "CLUSTER IN USE",
            "EXPIRED LEASES",
        ),
    ),
    (
        "circuitbreaker",
        "Circuit breakers",
        ("NAME", "STATE", "FAILURE RATE", "SLOW RATE", "BUFFERED", "NOT PERMITTED", "OPEN FOR"),
    ),
    (
        "retry",
        "Retries",
        ("NAME", "MAX ATTEMPTS", "OK", "OK AFTER RETRY", "FAILED AFTER RETRY", "FAILED", "ATTEMPTS"),
    ),
    ("timelimiter", "Time limiters", ("NAME", "TIMEOUT", "OK", "FAILED", "TIMEOUTS")),
    (
        "adaptivethrottler",
        "Adaptive throttlers",
        ("NAME", "K", "REQUESTS/ACCEPTS", "P(REJECT)", "ACCEPTED", "REJECTED", "THROTTLED"),
    ),
    ("retrybudget", "Retry budgets", ("NAME", "BUDGET", "TTL", "BALANCE", "CALLS", "RETRIES", "REFUSED")),
]


def render_table(items: list[dict[str, Any]]) -> str:
    """The readable form of a snapshot: one aligned table per type (empty types left out)."""
    if not items:
        return "No instances configured in RATELIMIT_R4."
    blocks = []
    for type_name, title, headers in _SECTIONS:
        of_type = [i for i in items if i["type"] == type_name]
        if not of_type:
            continue
        lines = [title, *_table(headers, [_row(i, len(headers)) for i in of_type])]
        for item in of_type:
            if item["state"] is None:
                lines.append(f"  {item['name']}: cannot be read: {item.get('error')}")
                continue
            backend = item["state"].get("backend")
            if backend is not None and backend["degraded"]:
                lines.append(
                    f"  {item['name']}: {backend['kind']} at {backend['url']} DEGRADED for "
                    f"{backend['degraded_seconds']:g}s: fault policy {backend['fault_policy']}, "
                    f"{backend['fault_decisions']} decisions by the policy here; last error: {backend['last_error']}"
                )
            lease = item["state"].get("lease")
            if lease is not None:  # permit leases (``"lease": N``): this process's counters
                lines.append(
                    f"  {item['name']}: lease {lease['lease']}: {lease['batches']} batches, "
                    f"{lease['leased_permits']} permits leased, {lease['spent_permits']} spent locally, "
                    f"{lease['expired_permits']} expired, {lease['dropped_permits']} dropped, "
                    f"{lease['held_permits']} held"
                )
            shared = item["state"].get("shared")
            if shared is not None:  # a cluster-wide circuit breaker
                line = f"  {item['name']}: cluster-wide through backend {shared['backend']!r} (epoch {shared['epoch']})"
                if shared["degraded"]:
                    line += (
                        f"; DEGRADED for {shared['degraded_seconds']:g}s: Redis unreachable, this worker decides "
                        f"alone (local breaker); last error: {shared['last_error']}"
                    )
                lines.append(line)
            keys = (item["state"].get("keyed") or {}).get("keys")
            if keys:
                lines.append(f"  {item['name']}: keys")
                lines.extend(
                    f"    {_shown_key(key)}: {v['available_permissions']} available, wait {human_ns(v['nanos_to_wait'])}"
                    for key, v in keys.items()
                )
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _shown_key(key: str) -> str:
    """A client key for the terminal: as it is when printable, else its ``repr`` (a client chose the text: a raw
    newline would forge table lines, an ESC sequence would reach the operator's terminal). ``--json`` is exact."""
    return key if key.isprintable() else repr(key)


def _age(seconds: float) -> str:
    return human_ns(int(seconds * 1e9)) if seconds >= 0.001 else "0"


def describe_worker(w: dict[str, Any] | None) -> str:
    """``"web-1 pid 4242"`` for a worker dict (``host``, ``pid``); ``"an unknown worker"`` without one."""
    if not w or w.get("pid") is None:
        return "an unknown worker"
    return f"{w.get('host') or '?'} pid {w['pid']}"


def render_cluster(view: dict[str, Any]) -> str:
    """The readable form of a cluster status (:func:`django_ratelimit_r4.control.cluster_status`)."""
    workers = view.get("workers") or []
    interval = float(view.get("heartbeat_interval_seconds") or 0)
    now = time.time()
    head = (
        f"Workers: {len(workers)} live (control plane on backend {view.get('backend')!r}; a heartbeat every "
        f"{interval:g}s, listed until {3 * interval:g}s without one)"
    )
    rows = [
        [
            str(w.get("host", "?")),
            str(w.get("pid", "?")),
            _age(max(0.0, now - float(w.get("started") or now))),
            _age(float(w.get("age_seconds") or 0)) + " ago",
        ]
        for w in workers
    ]
    lines = [head]
    if rows:
        lines.extend(_table(("HOST", "PID", "UP", "HEARTBEAT"), rows))
    totals = view.get("totals") or []
    lines.append("")
    lines.append(
        f"Totals over the {len(workers)} workers (counters summed; state shared in Redis shown once; "
        "MIXED: the workers' breaker states differ)"
    )
    lines.append("")
    lines.append(render_table(totals))
    return "\n".join(lines)


# ------------------------------------------------------------------------------- the state endpoint


def is_loopback_host(host: str | None) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ``::1``, IPv4-mapped 127.x)."""
    if not host:
        return False
    host = host.rstrip(".").lower()
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])  # drop an IPv6 zone id
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Never follow a redirect: urllib would resend the ``Authorization`` header to the new Location."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        """Decline every redirect, so urllib raises the 30x as an ``HTTPError`` (handled in :class:`Remote`)."""
        return None


class Remote:
    """Client of a running server's state endpoint (``django_ratelimit_r4.urls``), over urllib.

    The bearer token is sent to ``url`` only: redirects are refused, never followed.
    """

    def __init__(self, url: str, token: str) -> None:
        self.base = url if url.endswith("/") else url + "/"
        self.token = token
        self._opener = urllib.request.build_opener(_NoRedirect)
        #: ``{"host", "pid"}`` of the worker that answered the last request (its ``X-R4-Worker-*`` headers).
        self.last_worker: dict[str, Any] | None = None

    def view(self, names: Sequence[str], include_keys: bool) -> list[dict[str, Any]] | dict[str, Any]:
        """``GET <base>?cluster=1``: the cluster view (a dict) with a control plane; else the answering worker's
        (``{"scope": "worker", ...}``, or the plain list from a server older than the control plane)."""
        query = [("name", n) for n in names] + ([("keys", "1")] if include_keys else []) + [("cluster", "1")]
        url = self.base + "?" + urllib.parse.urlencode(query)
        data = self._request(url, None)
        if not isinstance(data, list) and not (isinstance(data, dict) and data.get("scope") in ("worker", "cluster")):
            raise CommandError(f"{url} did not answer with a state list; is --url the state endpoint?")
        return data

    def status(self, names: Sequence[str], include_keys: bool) -> list[dict[str, Any]]:
        """``GET <base>?name=..&keys=1``: the snapshot list of the worker that answers."""
        query = [("name", n) for n in names] + ([("keys", "1")] if include_keys else [])
        url = self.base + ("?" + urllib.parse.urlencode(query) if query else "")
        data = self._request(url, None)
        if not isinstance(data, list):
            raise CommandError(f"{url} did not answer with a state list; is --url the state endpoint?")
        return data

    def act(self, name: str, action: str, body: dict[str, Any]) -> dict[str, Any]:
        """``POST <base><name>/<action>`` with a JSON body; the action's result."""
        url = f"{self.base}{urllib.parse.quote(name, safe=':')}/{action}"
        data = self._request(url, json.dumps(body).encode())
        if not isinstance(data, dict):
            raise CommandError(f"{url} answered with unexpected data: {data!r}")
        return data

    def _request(self, url: str, body: bytes | None) -> Any:
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(
            url, data=body, headers=headers, method="GET" if body is None else "POST"
        )
        try:  # _remote() accepted only http(s) URLs and redirects are refused: no file:// reads
            with self._opener.open(request, timeout=HTTP_TIMEOUT + MAX_WAIT_S) as response:
                payload = response.read()
                pid = response.headers.get("X-R4-Worker-Pid")
                self.last_worker = (
                    {"host": response.headers.get("X-R4-Worker-Host"), "pid": int(pid)}
                    if pid and pid.isdigit()
                    else None
                )
        except urllib.error.HTTPError as exc:
            raise CommandError(self._http_error(url, exc)) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise CommandError(f"cannot reach the state endpoint at {url}: {reason}") from None
        try:
            return json.loads(payload)
        except ValueError:
            raise CommandError(f"{url} did not answer with JSON; is --url the state endpoint?") from None

    @staticmethod
    def _http_error(url: str, exc: urllib.error.HTTPError) -> str:
        if 300 <= exc.code < 400:
            location = exc.headers.get("Location") if exc.headers is not None else None
            return (
                f"{url} answered HTTP {exc.code} redirecting to {location or '(no Location header)'}; "
                "the command does not follow redirects, so the bearer token is only ever sent to --url. "
                "Pass the final address of the state endpoint as --url (e.g. https:// and a trailing slash)."
            )
        try:
            message = json.loads(exc.read()).get("error")
        except Exception:
            message = None
        if message:
            return f"the server refused: {message} (HTTP {exc.code})"
        if exc.code == 404:
            return (
                f"{url} answered 404: either the URL is not the state endpoint or the token was refused "
                "(the endpoint answers 404 to anyone it does not authorize)"
            )
        return f"{url} answered HTTP {exc.code} {exc.reason}"


# ----------------------------------------------------------------------------------------- command


class Command(BaseCommand):
    """``manage.py r4``: status, reset, drain, transition (locally or through ``--url``)."""

    help = (
        "Show and steer RATELIMIT_R4's rate limiters, bulkheads, circuit breakers, retries and time limiters. "
        "With the in-memory backend the state lives in each server process: use --url to reach a running server."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        """The four subcommands and their options."""
        sub = parser.add_subparsers(
            dest="subcommand", required=True, metavar="{status,reset,drain,transition}"
        )

        def remote(p: ArgumentParser) -> None:
            p.add_argument("--url", help="a running server's state endpoint, e.g. https://host/ops/r4/")
            p.add_argument(
                "--token", help=f"bearer token for --url (default: ${TOKEN_ENV}, then the setting)"
            )
            p.add_argument(
                "--allow-insecure-http",
                action="store_true",
                help="send the token over plain http:// to a host that is not loopback (it travels in clear text)",
            )

        status = sub.add_parser("status", help="config and live state of every (or the named) instance")
        status.add_argument(
            "names", nargs="*", metavar="NAME", help="only these instances (bare or type:name)"
        )
        status.add_argument("--json", action="store_true", help="print the state list as JSON")
        status.add_argument("--keys", action="store_true", help="include client keys of keyed rate limiters")
        status.add_argument(
            "--watch", type=_positive_seconds, metavar="SECONDS", help="redraw every SECONDS until Ctrl-C"
        )
        remote(status)

        def timeout(p: ArgumentParser) -> None:
            p.add_argument(
                "--timeout",
                type=_wait_seconds,
                metavar="SECONDS",
                help=f"with a control plane: how long to wait for every worker's acknowledgement "
                f"(default {control.DEFAULT_TIMEOUT_S:g}, at most {MAX_WAIT_S:g})",
            )

        reset = sub.add_parser("reset", help="return an instance (or one client key) to its fresh state")
        reset.add_argument("name", metavar="NAME")
        reset.add_argument("--key", help="only this client key, as stored (e.g. ip:203.0.113.7, user:42)")
        timeout(reset)
        remote(reset)

        drain = sub.add_parser("drain", help="set a rate limiter's available permissions to 0")
        drain.add_argument("name", metavar="NAME")
        drain.add_argument("--key", help="only this client key, as stored (e.g. ip:203.0.113.7, user:42)")
        timeout(drain)
        remote(drain)

        transition = sub.add_parser("transition", help="move a circuit breaker to another state")
        transition.add_argument("name", metavar="NAME")
        transition.add_argument("--to", required=True, type=str.upper, choices=list(state.TRANSITION_TARGETS))
        timeout(transition)
        remote(transition)

    def handle(self, *args: Any, **options: Any) -> None:
        """Dispatch to the subcommand; every failure becomes a ``CommandError`` with a clear message."""
        remote = self._remote(options)
        if remote is None:
            self._note_local()
        try:
            if options["subcommand"] == "status":
                self._status(remote, options)
            else:
                self._act(remote, options)
        except state.StateError as exc:
            raise CommandError(str(exc)) from None
        except ImproperlyConfigured as exc:
            raise CommandError(f"RATELIMIT_R4 is misconfigured: {exc}") from None

    # -- helpers ----------------------------------------------------------------------------------

    def _remote(self, options: dict[str, Any]) -> Remote | None:
        url = options.get("url")
        if not url:
            return None
        if not url.isprintable() or any(c.isspace() for c in url):  # urllib's InvalidURL, a traceback
            raise CommandError(f"--url holds whitespace or a control character: {redact_url(url)!r}")
        try:
            parts = urllib.parse.urlsplit(url)
            parts.port  # noqa: B018  # raises ValueError: not a number, out of range
        except ValueError as exc:
            raise CommandError(f"--url is not a valid URL ({exc}): {redact_url(url)!r}") from None
        if parts.scheme not in ("http", "https"):
            raise CommandError(f"--url must be an http:// or https:// URL, got {redact_url(url)!r}")
        if "@" in parts.netloc:
            # urllib sends no user:password@, and every error message would show it: the token authenticates.
            raise CommandError(
                f"--url must not carry user:password@ (the bearer token authenticates): {redact_url(url)!r}"
            )
        insecure = parts.scheme == "http" and not is_loopback_host(parts.hostname)
        if insecure and not options.get("allow_insecure_http"):
            raise CommandError(
                f"refusing to send the bearer token over plain http:// to {parts.hostname!r}: anyone on the "
                "path could read it. Use https://, or pass --allow-insecure-http if you accept that "
                "(plain http:// is always allowed to loopback: 127.0.0.0/8, ::1, localhost)."
            )
        token, source = options.get("token"), "--token"
        if not token:
            token, source = os.environ.get(TOKEN_ENV), f"${TOKEN_ENV}"
        if not token:
            try:
                token, source = conf.get_options().state_endpoint_token, "the setting"
            except ImproperlyConfigured:
                token = None
        if not token:
            raise CommandError(
                f"--url needs the endpoint's bearer token: pass --token, set ${TOKEN_ENV}, "
                'or set RATELIMIT_R4["state_endpoint_token"]'
            )
        error = conf.token_error(token)  # the setting's rule; urllib would print the token in its ValueError
        if error is not None:
            raise CommandError(f"the bearer token of {source} {error}")
        return Remote(url, token.strip())  # the endpoint strips it too: an env file's line ending is no part of it

    def _note_local(self) -> None:
        analysis = conf.get_analysis()
        if analysis.control is not None:
            return  # the control plane reaches every worker: no caveat
        default = analysis.backends.get("default")
        shared = sorted(
            {
                b.backend
                for b in (analysis.backends.get(s.options["backend"]) for s in analysis.specs["ratelimiters"].values())
                if b is not None and not b.per_process
            }
            or ({default.backend} if default is not None and not default.per_process else set())
        )
        backend = ", ".join(shared)
        if conf.per_process_rate_limiters(analysis) or not shared:
            self.stderr.write(
                "note: with the in-memory backend every server process keeps its own state; this shows (and "
                "changes) only this command's own process, freshly built. Use --url to reach a running server."
            )
        else:
            self.stderr.write(
                f"note: rate limiters read the shared {backend} state; bulkheads, circuit breakers, retries and "
                "time limiters live in each server process (this shows this command's own). Use --url for those."
            )

    def _status(self, remote: Remote | None, options: dict[str, Any]) -> None:
        names: list[str] = options["names"]
        keys: bool = options["keys"]
        watch: float | None = options["watch"]
        cluster_here = remote is None and not keys and conf.get_control() is not None
        try:
            while True:
                data: list[dict[str, Any]] | dict[str, Any]
                if remote is not None:
                    data = remote.view(names, keys)
                elif cluster_here:
                    data = control.cluster_status(names or None)
                else:
                    data = state.snapshot(names or None, include_keys=keys)
                try:
                    text, note = self._render(data, remote, options["json"])
                except (KeyError, TypeError, AttributeError, ValueError) as exc:
                    if remote is None:
                        raise
                    # Another JSON API (or another shape) behind --url: say so, not a traceback of the table code.
                    raise CommandError(
                        f"{remote.base} answered with JSON that is not a state list this command can show "
                        f"({type(exc).__name__}: {exc}); is --url the state endpoint? (--json prints the answer as is)"
                    ) from None
                if watch is None:
                    self.stdout.write(text)
                    if note:
                        self.stderr.write(note)
                    return
                where = remote.base if remote is not None else "this process"
                if note:
                    text = f"{text}\n\n{note}"
                self.stdout.write(
                    f"{CLEAR}r4 status of {where} at {time.strftime('%H:%M:%S')} "
                    f"(every {watch:g}s, Ctrl-C to stop)\n\n{text}"
                )
                self.stdout.flush()
                sleep(watch)
        except KeyboardInterrupt:
            if watch is None:
                raise
            self.stdout.write("")  # leave the prompt on a fresh line; a clean exit, status 0

    @staticmethod
    def _render(
        data: list[dict[str, Any]] | dict[str, Any], remote: Remote | None, as_json: bool
    ) -> tuple[str, str | None]:
        """The status text for stdout and a note for stderr (which worker answered), from any view's data."""
        if isinstance(data, dict) and data.get("scope") == "cluster":
            return (json.dumps(data, indent=2, sort_keys=True) if as_json else render_cluster(data)), None
        if isinstance(data, dict):  # one worker's view: {"scope": "worker", "worker": ..., "instances": [...]}
            items, who = data.get("instances") or [], data.get("worker")
        else:
            items, who = data, remote.last_worker if remote is not None else None
        text = json.dumps(items, indent=2, sort_keys=True) if as_json else render_table(items)
        note = None
        if remote is not None:
            note = (
                f"answered by worker {describe_worker(who)}: its bulkheads, circuit breakers, retries, time limiters and "
                "per-process rate limiters are that worker's own (others may differ); set "
                'RATELIMIT_R4["control"] to see every worker'
            )
        return text, note

    def _act(self, remote: Remote | None, options: dict[str, Any]) -> None:
        action, name = options["subcommand"], options["name"]
        body = {"to": options["to"]} if action == "transition" else {"key": options["key"]}
        wait = options.get("timeout")
        who: dict[str, Any] | None = None
        if remote is not None:
            if wait is not None:
                body["timeout"] = wait
            result = remote.act(name, action, {k: v for k, v in body.items() if v is not None})
            who = result.get("worker") or remote.last_worker
        elif conf.get_control() is not None:
            result = control.broadcast(
                action,
                name,
                key=options.get("key"),
                to=options.get("to"),
                timeout=control.DEFAULT_TIMEOUT_S if wait is None else wait,
            )
        else:
            if action == "transition":
                result = state.transition(name, options["to"])
            elif action == "reset":
                result = state.reset(name, key=options["key"])
            else:
                result = state.drain(name, key=options["key"])
        if result.get("scope") == "cluster":
            self._report_cluster(result)
            return
        line = self._describe(result)
        if remote is not None:
            line += (
                f" on worker {describe_worker(who)} only: without a control plane the other workers keep their own "
                'state (set RATELIMIT_R4["control"] to reach every worker)'
            )
        self.stdout.write(line)

    def _report_cluster(self, result: dict[str, Any]) -> None:
        """Print who acknowledged a broadcast action; fail unless every live worker did, without error."""
        acks, missing = result.get("acks") or [], result.get("missing") or []
        failed = [a for a in acks if not a.get("ok")]
        live = len(acks) + len(missing)
        what = f"{result.get('action')} {result.get('name')!r}"
        self.stdout.write(
            f"{what}: acknowledged by {len(acks)} of {live} live worker(s) "
            f"within {float(result.get('timeout_seconds') or 0):g}s"
            + (f", {len(failed)} refused" if failed else "")
        )
        for ack in acks:
            outcome = self._describe(ack["result"]) if ack.get("ok") else f"refused: {ack.get('error')}"
            self.stdout.write(f"  {describe_worker(ack)}: {outcome}")
        for gone in missing:
            self.stdout.write(f"  {describe_worker(gone)}: NO ACKNOWLEDGEMENT")
        if missing or failed:
            parts = []
            if missing:
                parts.append(
                    f"{len(missing)} live worker(s) did not acknowledge: "
                    + ", ".join(describe_worker(m) for m in missing)
                    + " (stopped, stalled or cut off from Redis; a worker listed in r4 status stays listed for "
                    "three heartbeat intervals after its last heartbeat)"
                )
            if failed:
                parts.append(f"{len(failed)} worker(s) refused: " + ", ".join(describe_worker(f) for f in failed))
            raise CommandError("; ".join(parts))

    @staticmethod
    def _describe(result: dict[str, Any]) -> str:
        who = f"{result.get('type', '?')} {result.get('name', '?')!r}"
        if "key" in result:
            who += " (one client key)"  # the key itself stays out of logs and terminals' scrollback
        action = result.get("action")
        if action == "transition":
            shared = " (cluster-wide breaker: one shared transition)" if result.get("shared") else ""
            return f"{who}: {result.get('from_state')} -> {result.get('to_state')}{shared}"
        if action == "drain":
            return f"{who}: drained {result.get('drained')} permission(s)"
        return f"{who}: reset"
