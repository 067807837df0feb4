"""The simulated partner's knobs (down? how slow?), shared by every worker process when asked to.

Under ``runserver`` the demo is one process and the knobs are plain attributes. Under gunicorn or
uvicorn with several workers, the dashboard's "partner down" click reaches one worker only, yet the
partner is one external system for all of them. So when ``DEMO_STATE_DIR`` is set (``serve.py``
sets it), the knobs live in a small JSON file there: a write replaces the file atomically and a read
re-reads it when its identity changed, checked at most every ``REFRESH_S``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

__all__ = ["DEFAULT_LATENCY_S", "MAX_LATENCY_S", "REFRESH_S", "PartnerState"]

#: The partner's latency when nobody changed it (a healthy acquirer answers in about 50 ms).
DEFAULT_LATENCY_S = 0.050
#: Latencies above this are clamped: the demo is about slowness, not hung requests.
MAX_LATENCY_S = 5.0
#: A worker notices another worker's change within this many seconds.
REFRESH_S = 0.1


class PartnerState:
    """Whether the simulated acquirer is down and how long it takes to answer.

    :param path: JSON file shared by the workers, or ``None`` for process-local knobs.
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._down = False
        self._latency_s = DEFAULT_LATENCY_S
        self._signature: tuple[int, int, int] | None = None
        self._checked_at = float("-inf")
        self._lock = threading.Lock()

    @property
    def down(self) -> bool:
        """True while the partner fails every call."""
        if self.path is not None:
            self._refresh()
        return self._down

    @down.setter
    def down(self, value: bool) -> None:
        self._write(down=bool(value))

    @property
    def latency_s(self) -> float:
        """Seconds each call to the partner takes (0 to :data:`MAX_LATENCY_S`)."""
        if self.path is not None:
            self._refresh()
        return self._latency_s

    @latency_s.setter
    def latency_s(self, value: float) -> None:
        self._write(latency_s=max(0.0, min(float(value), MAX_LATENCY_S)))

    def as_dict(self) -> dict[str, object]:
        """``{"down": bool, "latency_ms": float}`` for JSON answers."""
        return {"down": self.down, "latency_ms": round(self.latency_s * 1000, 3)}

    def _write(self, **changes: object) -> None:
        with self._lock:
            if self.path is not None:
                self._refresh(force=True)
            self._down = bool(changes.get("down", self._down))
            self._latency_s = float(changes.get("latency_s", self._latency_s))  # type: ignore[arg-type]
            if self.path is None:
                return
            # Write-then-rename: a reader sees the old file or the new one, never half of one.
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}")
            tmp.write_text(json.dumps({"down": self._down, "latency_s": self._latency_s}))
            os.replace(tmp, self.path)
            self._signature = None  # our own write: re-read it next time like everyone else
            self._checked_at = float("-inf")

    def _refresh(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._checked_at < REFRESH_S:
            return
        self._checked_at = now
        assert self.path is not None
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return  # nobody changed anything yet: defaults
        signature = (st.st_ino, st.st_mtime_ns, st.st_size)
        if signature == self._signature:
            return
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return  # replaced under us: the next refresh reads the new file
        self._down = bool(data.get("down", False))
        self._latency_s = float(data.get("latency_s", DEFAULT_LATENCY_S))
        self._signature = signature
