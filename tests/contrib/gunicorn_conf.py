"""gunicorn configuration for ``test_prometheus_gunicorn.py``: the hooks docs/operations.md documents.

Everything else (workers, bind, environment) is given on the command line by the test.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import multiprocess


def worker_exit(server: Any, worker: Any) -> None:
    """Flush this worker's last interval of counts into PROMETHEUS_MULTIPROC_DIR."""
    from django_ratelimit_r4.contrib import prometheus

    prometheus.sync_now()


def child_exit(server: Any, worker: Any) -> None:
    """In the master: drop the dead worker's live* gauge files."""
    multiprocess.mark_process_dead(worker.pid)
