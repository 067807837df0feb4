"""A Redis client that loses a cancellation, as redis-py 8.2's asyncio client now and then does: the task is
cancelled during the call, yet the call returns its reply and the CancelledError is gone.

:func:`losing` wraps the real call: the command runs and its reply is read, then the call waits (at most
:data:`HANG_GUARD_S`) for the cancellation, swallows it and returns the reply anyway. :func:`cancel_lost`
runs a coroutine to that point, cancels it there and returns what became of it. Deterministic: no timing,
the cancellation always lands inside the wrapped call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

HANG_GUARD_S = 20.0


class Loser:
    """Wraps async callables so that their next matching call loses a cancellation (see the module doc)."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.lost = 0

    def wrap(self, real: Callable[..., Awaitable[Any]], when: Callable[..., bool] = lambda *a: True) -> Any:
        async def losing(*args: Any, **kwargs: Any) -> Any:
            if self.entered.is_set() or not when(*args):
                return await real(*args, **kwargs)
            reply = await real(*args, **kwargs)  # the command ran: its effects are on the server
            self.entered.set()
            try:
                await asyncio.sleep(HANG_GUARD_S)  # the cancellation lands here...
            except asyncio.CancelledError:
                self.lost += 1  # ...and is lost: the reply comes back as if nothing happened
            return reply

        return losing


async def cancel_lost(loser: Loser, call: Awaitable[Any]) -> asyncio.Task[Any]:
    """Run ``call`` until ``loser``'s wrapped call has its reply, cancel it there, and return the finished task
    (cancelled, or done with the result or exception the caller made of the lost cancellation)."""
    task = asyncio.ensure_future(call)
    await asyncio.wait_for(loser.entered.wait(), HANG_GUARD_S)
    task.cancel()
    await asyncio.wait([task], timeout=HANG_GUARD_S)
    assert task.done(), "hang guard: the cancelled call never finished"
    assert loser.lost == 1, "the cancellation did not land in the wrapped call"
    return task
