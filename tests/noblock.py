"""Catch blocking calls on the event loop's thread by what they are, not by how long they took.

Wall-clock detectors (asyncio debug mode's ``slow_callback_duration``, a heartbeat's lateness) cannot tell a
blocked loop from a starved process: on a busy 2-core CI machine a healthy task step can take a second. This
records the calls that *would* block, made on the loop's thread while the context is open:

* ``time.sleep``;
* socket operations on a blocking socket (``gettimeout() != 0``: a sync Redis client, ``urllib``, ...);
  asyncio's own sockets are non-blocking and pass;
* ``threading.Condition.wait`` (and so ``Event.wait``, ``Semaphore.acquire``, ``Barrier.wait``) with a
  timeout other than 0, except ``Thread.start()``'s own hand-off (``run_in_executor`` starting a worker);
* a blocking ``acquire`` of a ``threading.Lock`` created while the context is open that another thread holds
  (how a bulkhead parks a thread), except, again, ``Thread.start()``'s hand-off.

Each entry names the call and where it was made. Other threads are not watched: threads may block.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

_SOCKET_METHODS = ("connect", "recv", "recv_into", "recvfrom", "send", "sendall", "accept")


def _where() -> str:
    frames = traceback.extract_stack()
    frame = next((f for f in reversed(frames) if f.filename not in (__file__, threading.__file__)), frames[-1])
    return f"{frame.filename}:{frame.lineno} in {frame.name}"


def _starting_a_thread() -> bool:
    # Thread.start() waits on its own Event until the new thread runs: a bounded hand-off, not a park. That
    # covers taking the Event's lock again after the new thread's notify (it may still hold it): from
    # _WatchedLock.acquire up through Condition._acquire_restore, Condition.wait, this module's wait, Event.wait.
    frame = sys._getframe(2)
    for _ in range(8):
        if frame is None:
            return False
        if frame.f_code.co_name == "start" and frame.f_code.co_filename == threading.__file__:
            return True
        frame = frame.f_back
    return False


class _WatchedLock:
    """A ``threading.Lock`` stand-in that reports a blocking acquire that would wait on the watched thread."""

    __slots__ = ("_lock", "_report")

    def __init__(self, report: Any) -> None:
        self._lock = threading._allocate_lock()  # type: ignore[attr-defined]
        self._report = report

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._lock.acquire(False):
            return True
        if blocking and timeout != 0 and not _starting_a_thread():
            self._report(f"Lock.acquire(timeout={timeout}) waiting for another thread")
        return bool(self._lock.acquire(blocking, timeout))

    __enter__ = acquire

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    def release(self) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return bool(self._lock.locked())


@contextmanager
def forbid_blocking(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Yield a list that collects every blocking call made on the current thread (the loop's) until exit."""
    watched = threading.get_ident()
    violations: list[str] = []

    def report(what: str) -> None:
        if threading.get_ident() == watched:
            violations.append(f"{what} at {_where()}")

    real_sleep = time.sleep

    def sleep(seconds: float) -> None:
        report(f"time.sleep({seconds})")
        real_sleep(seconds)

    def socket_method(name: str) -> Any:
        real = getattr(socket.socket, name)

        def method(self: socket.socket, *args: Any, **kwargs: Any) -> Any:
            if self.gettimeout() != 0.0:
                report(f"blocking socket.{name}")
            return real(self, *args, **kwargs)

        return method

    real_wait = threading.Condition.wait

    def wait(self: threading.Condition, timeout: float | None = None) -> bool:
        if timeout != 0 and not _starting_a_thread():
            report(f"Condition.wait(timeout={timeout})")
        return real_wait(self, timeout)

    with monkeypatch.context() as patch:
        patch.setattr(time, "sleep", sleep)
        for name in _SOCKET_METHODS:
            patch.setattr(socket.socket, name, socket_method(name))
        patch.setattr(threading.Condition, "wait", wait)
        patch.setattr(threading, "Lock", lambda: _WatchedLock(report))
        yield violations
