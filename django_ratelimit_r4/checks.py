"""System checks for ``RATELIMIT_R4``: every mistake at once, each with its setting path and a hint.

The errors come from :func:`django_ratelimit_r4.conf.analyse` (which reuses the config classes'
validators); the ids are the :class:`~django_ratelimit_r4.conf.Code` table. Warnings that depend on
the environment (multi-process deployment, missing optional packages) are computed here.
Silence one with ``SILENCED_SYSTEM_CHECKS = ["ratelimit_r4.W001"]``.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from django.core.checks import CheckMessage, Error, register
from django.core.checks import Warning as CheckWarning

from . import conf
from .conf import Code, Problem

__all__ = ["check_settings", "detect_multiprocess", "problem_to_message"]

_SERVERS = ("gunicorn", "uvicorn", "hypercorn")


def problem_to_message(problem: Problem) -> CheckMessage:
    """Render a :class:`Problem` as a Django check message under its stable id."""
    cls = CheckWarning if problem.code.value.startswith("W") else Error
    return cls(f"{problem.path}: {problem.message}", hint=problem.hint, id=problem.check_id)


def _positive_int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _workers_in_args(args: Sequence[str]) -> int | None:
    """The value of ``-w N`` / ``-wN`` / ``--workers N`` / ``--workers=N`` in a command line."""
    found = None
    for i, arg in enumerate(args):
        if arg in ("-w", "--workers") and i + 1 < len(args):
            found = _positive_int(args[i + 1])
        elif arg.startswith("--workers="):
            found = _positive_int(arg.split("=", 1)[1])
        elif arg.startswith("-w") and arg[2:].isdigit():
            found = _positive_int(arg[2:])
    return found


def _names_a_server(arg: str) -> bool:
    """``/venv/bin/gunicorn`` or, under ``python -m gunicorn``, ``.../site-packages/gunicorn/__main__.py``."""
    name = os.path.basename(arg)
    if name == "__main__.py":
        name = os.path.basename(os.path.dirname(arg))
    return name.startswith(_SERVERS)


def detect_multiprocess(environ: Mapping[str, str], argv: Sequence[str]) -> str | None:
    """Describe why the deployment looks multi-process (several workers), or return None.

    Explicit worker counts win (``WEB_CONCURRENCY`` is also gunicorn's and uvicorn's default);
    a gunicorn ``SERVER_SOFTWARE`` without a known count counts as multi-process.
    """
    counts: list[tuple[int, str]] = []
    web = _positive_int(environ.get("WEB_CONCURRENCY"))
    if web is not None:
        counts.append((web, f"WEB_CONCURRENCY={web}"))
    gunicorn_args = environ.get("GUNICORN_CMD_ARGS")
    if gunicorn_args:
        try:
            n = _workers_in_args(shlex.split(gunicorn_args))
        except ValueError:
            n = None
        if n is not None:
            counts.append((n, f"GUNICORN_CMD_ARGS workers={n}"))
    if any(_names_a_server(a) for a in argv[:3]):
        n = _workers_in_args(list(argv))
        if n is not None:
            counts.append((n, f"--workers {n} on the command line"))
    many = [why for n, why in counts if n > 1]
    if many:
        return ", ".join(many)
    software = environ.get("SERVER_SOFTWARE", "")
    if not counts and software.lower().startswith("gunicorn"):
        return f"SERVER_SOFTWARE={software} (worker count unknown)"
    return None


def _environment_warnings(
    analysis: conf.Analysis, environ: Mapping[str, str], argv: Sequence[str]
) -> list[Problem]:
    problems: list[Problem] = []
    raw = analysis.raw if isinstance(analysis.raw, Mapping) else {}
    options = analysis.options
    backend = options.backend if options is not None else "memory"
    if backend == "memory" and analysis.names("ratelimiters"):
        why = detect_multiprocess(environ, argv)
        if why is not None:
            problems.append(
                Problem(
                    Code.MEMORY_MULTIPROCESS,
                    conf.setting_path("backend"),
                    f"rate limiters keep their state in memory but this deployment looks multi-process ({why}): "
                    "limits are per process: a limit of 10 becomes 10 x N workers",
                    'Use the redis backend for global quotas (RATELIMIT_R4["backend"] = "redis"), '
                    "or silence ratelimit_r4.W001 if per-process limits are intended.",
                )
            )
    if raw.get("metrics") is True and importlib.util.find_spec("prometheus_client") is None:
        problems.append(
            Problem(
                Code.METRICS_WITHOUT_PROMETHEUS,
                conf.setting_path("metrics"),
                "metrics is True but prometheus_client is not installed, so no metrics are exported",
                "pip install 'django-ratelimit-r4[prometheus]', or remove the metrics option.",
            )
        )
    token = options.state_endpoint_token if options is not None else None
    if token is not None and len(token) < 32:
        problems.append(
            Problem(
                Code.SHORT_TOKEN,
                conf.setting_path("state_endpoint_token"),
                f"the token is {len(token)} characters long; short tokens can be guessed",
                "Use at least 32 random characters: python -c 'import secrets; print(secrets.token_urlsafe(32))'.",
            )
        )
    return problems


@register("ratelimit_r4")
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Report every problem in ``settings.RATELIMIT_R4`` (registered with Django's check framework)."""
    analysis = conf.analyse(conf.raw_setting(), conf.drf_throttle_rates())  # fresh: checks must see the settings as they are now
    problems = analysis.problems + _environment_warnings(analysis, os.environ, sys.argv)
    return [problem_to_message(p) for p in problems]
