"""gunicorn configuration of the cluster test site: the control plane starts when a worker boots (docs/operations.md)."""

from __future__ import annotations

from typing import Any


def post_worker_init(worker: Any) -> None:
    """Start this worker's control plane now: listed and reachable before its first request."""
    from django_ratelimit_r4 import control

    control.start()


def worker_exit(server: Any, worker: Any) -> None:
    """Leave the list at once on a clean exit (a killed worker drops out after its heartbeat's TTL)."""
    from django_ratelimit_r4 import control

    control.stop()


control_socket_disable = True
