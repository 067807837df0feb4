"""gunicorn configuration of the demo (``make demo-gunicorn``, ``make demo-redis``, ``make demo-cluster``):
docs/operations.md's hooks.

serve.py gives the rest on the command line (workers, threads, bind) and points
``PROMETHEUS_MULTIPROC_DIR`` at a fresh empty directory before gunicorn starts.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import multiprocess


def post_worker_init(worker: Any) -> None:
    """In a new worker: start its control plane (with DEMO_CONTROL=1; a no-op otherwise), so `r4 status` lists it
    and `r4 transition` reaches it before its first request."""
    from django_ratelimit_r4 import control

    control.start()


def worker_exit(server: Any, worker: Any) -> None:
    """In the exiting worker: flush its last second of counts into PROMETHEUS_MULTIPROC_DIR; leave the control
    plane's list at once."""
    from django_ratelimit_r4 import control
    from django_ratelimit_r4.contrib import prometheus

    prometheus.sync_now()
    control.stop()


def child_exit(server: Any, worker: Any) -> None:
    """In the master: drop the dead worker's live* gauge files, so /metrics forgets its pid."""
    multiprocess.mark_process_dead(worker.pid)


# gunicorn >= 24 opens a control socket at ~/.gunicorn/gunicorn.ctl; two demos (or a demo and a test run)
# would fight over it, and the demo never uses it. Older gunicorns ignore the unknown name.
control_socket_disable = True

# One request per connection: a browser reuses its few keep-alive connections, which would pin the
# dashboard to one or two workers and hide the per-process story. A demo choice, not a production one.
keepalive = 0
