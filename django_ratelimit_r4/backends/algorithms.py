"""The smooth rate-limit algorithms as pure functions: GCRA and the exact sliding window (a log).

:func:`~.base.decide` is Resilience4j's cycle algorithm (a fixed window: up to ``2 * limit`` permits can pass
within a moment around a cycle boundary). The two algorithms here have no boundaries:

``"gcra"`` -- the generic cell rate algorithm. One integer of state per limiter or key, the *theoretical
arrival time* ``tat``, kept **scaled by** ``limit`` (in units of ``1/limit`` ns) so the emission interval
``period / limit`` is exact in integers whatever the rate. A request of ``k`` permits at ``now`` moves it to
``max(tat, now) + k * period / limit`` and conforms when that is at most ``now + burst * period / limit``.
O(1) time and memory. **Bound:** in any window of length ``L`` (half-open, integer ns) the permits handed over
are at most ``burst + ceil(L * limit / period) - 1``; for ``L = period`` that is ``limit + burst - 1``, so with
``burst = 1`` never more than ``limit`` in any window of one period, and within 2 ms at most
``burst + ceil(2 ms * limit / period) - 1``. A request of more than ``burst`` permits is never granted.

``"sliding_window"`` -- an exact sliding log: the times of the last ``limit`` permits (oldest first). Permits
``k`` are handed over at ``max(now, times[k - 1] + period, times[-1])``, the earliest instant at which the
window ending there holds at most ``limit``. **Guarantee:** never more than ``limit`` permits in any window of
length ``period`` (any ``limit + 1`` consecutive permits span at least ``period``). Cost: ``limit`` integers of
memory per limiter or key, O(``k``) time per decision of ``k`` permits (O(1) for one permit).

Every function takes ``timeout_ns`` like :func:`~.base.decide`: granted when the wait fits
(``timeout_ns >= wait``), a negative timeout is a side-effect-free peek, and a rejection changes nothing (no
ghost charge). Backends may inline these, but must give the same answers (property tests check them).
"""

from __future__ import annotations

__all__ = [
    "ALGORITHMS",
    "CYCLE",
    "GCRA",
    "MAX_SLIDING_WINDOW_LIMIT",
    "SLIDING_WINDOW",
    "gcra_available",
    "gcra_bound",
    "gcra_decide",
    "gcra_give_back",
    "gcra_quota",
    "sliding_available",
    "sliding_decide",
    "sliding_give_back",
    "sliding_initial",
    "sliding_quota",
]

# The names live with RateLimiterConfig in the framework-free layer (core/ imports nothing outside core/).
from ..core.backend import ALGORITHMS, CYCLE, GCRA, MAX_SLIDING_WINDOW_LIMIT, SLIDING_WINDOW

# ---------------------------------------------------------------------------------------------------- GCRA


def gcra_decide(
    tat: int, permits: int, timeout_ns: int, now_ns: int, period_ns: int, limit: int, burst: int
) -> tuple[int, int, bool]:
    """One GCRA decision: ``(new_tat, nanos_to_wait, granted)``; ``tat`` is scaled by ``limit``.

    ``tat <= now_ns * limit`` means full (a fresh limiter has ``tat = 0`` and ``now_ns >= 0``). The wait is
    the time until the request conforms, rounded up to whole ns; rejected (``permits > burst``, or the wait
    exceeds ``timeout_ns``) leaves ``tat`` unchanged.
    """
    now = now_ns * limit
    new_tat = (tat if tat > now else now) + permits * period_ns
    early = new_tat - burst * period_ns - now
    wait = -(-early // limit) if early > 0 else 0
    if permits <= burst and timeout_ns >= wait:
        return new_tat, wait, True
    return tat, wait, False


def gcra_available(tat: int, now_ns: int, period_ns: int, limit: int, burst: int) -> int:
    """Permits one request could take now (at most ``burst``; negative while reservations are pending)."""
    now = now_ns * limit
    return (now + burst * period_ns - (tat if tat > now else now)) // period_ns


def gcra_quota(tat: int, now_ns: int, period_ns: int, limit: int, burst: int) -> tuple[int, int]:
    """``(remaining, reset_ns)`` for the RateLimit header fields.

    ``remaining`` is :func:`gcra_available`; ``reset_ns`` is the time until the limiter is full again
    (``remaining == burst``; 0 when it is) while a permit remains, else the wait for one permit.
    """
    remaining = gcra_available(tat, now_ns, period_ns, limit, burst)
    now = now_ns * limit
    if remaining >= 1:
        return remaining, -(-(tat - now) // limit) if tat > now else 0
    return remaining, gcra_decide(tat, 1, -1, now_ns, period_ns, limit, burst)[1]


def gcra_give_back(tat: int, permits: int, granted_tat: int, now_ns: int, period_ns: int, limit: int) -> int:
    """``tat`` after undoing a grant of ``permits`` that left ``granted_tat`` (another part of an all-or-nothing
    decision rejected), at ``now_ns``; other decisions may have come in between.

    Of the grant, only what is still ahead of ``now`` can be owed back: ``back = min(permits * period,
    granted_tat - now)`` (scaled, at least 0), and ``tat`` moves back by that, no earlier than now (full).
    Never more permissive than had the grant not happened, whatever came in between: with the later grants
    ``m_j`` at ``t_j <= now``, the tat without the grant is at most ``max(tat - permits * period, now + sum
    m_j)``, and ``sum m_j <= tat - granted_tat``. Exact (the state without the grant) when nothing came in
    between; when the limiter was full again at a decision in between, that decision absorbed the grant and
    nothing (or less) comes back.
    """
    now = now_ns * limit
    if tat <= now:
        return tat  # full again: nothing of the grant is left
    back = min(permits * period_ns, granted_tat - now)
    return max(tat - back, now) if back > 0 else tat


def gcra_bound(window_ns: int, period_ns: int, limit: int, burst: int) -> int:
    """Most permits GCRA hands over in any half-open window of ``window_ns`` (see the module doc)."""
    return burst + -(-window_ns * limit // period_ns) - 1


# ------------------------------------------------------------------------------------------ sliding window


def sliding_initial(limit: int, period_ns: int) -> tuple[int, ...]:
    """A full log: ``limit`` times old enough (``-period_ns``) to be outside every window at ``now >= 0``."""
    return (-period_ns,) * limit


def sliding_decide(
    times: tuple[int, ...], permits: int, timeout_ns: int, now_ns: int, period_ns: int
) -> tuple[tuple[int, ...], int, bool]:
    """One sliding-log decision: ``(new_times, nanos_to_wait, granted)``.

    ``times`` are the hand-over times of the last ``limit`` permits, oldest first (``len(times) == limit``).
    Granted permits are handed over together at ``now + wait`` and appended; more than ``limit`` permits are
    never granted (the wait returned is then ``period_ns``).
    """
    limit = len(times)
    if permits > limit:
        return times, period_ns, False
    at = times[permits - 1] + period_ns
    if at < now_ns:
        at = now_ns
    if times[-1] > at:
        at = times[-1]  # keeps the log sorted: reservations are handed over in order
    wait = at - now_ns
    if timeout_ns >= wait:
        return times[permits:] + (at,) * permits, wait, True
    return times, wait, False


def sliding_give_back(
    times: tuple[int, ...], permits: int, granted_at: int, now_ns: int, period_ns: int
) -> tuple[int, ...]:
    """``times`` after undoing a grant of ``permits`` with timeout 0 decided (so logged) at ``granted_at``
    (another part of an all-or-nothing decision rejected), at ``now_ns``; other decisions may have come in
    between.

    ``permits`` times equal to ``granted_at`` leave the log (which ones does not matter: equal) and free slots
    (older than every window from ``now``) take their places at its old end. The slots the grant overwrote
    held times outside every later window, so freeing them loses nothing: exact. Nothing is given back when a
    time ``period_ns`` or more after ``granted_at`` was logged since: later grants may have overwritten the
    grant's times (never more permissive than without the grant).
    """
    limit = len(times)
    if permits > limit or times[-1] >= granted_at + period_ns:
        return times
    first = 0
    while first < limit and times[first] < granted_at:
        first += 1
    if first + permits > limit or times[first + permits - 1] != granted_at:
        return times
    free = min(times[0], now_ns - period_ns)
    return (free,) * permits + times[:first] + times[first + permits :]


def sliding_available(times: tuple[int, ...], now_ns: int, period_ns: int) -> int:
    """Permits one request could take now: the logged permits that left the window ``(now - period, now]``."""
    if times[-1] > now_ns:
        return 0  # a reservation is pending: later requests queue behind it
    edge = now_ns - period_ns
    count = 0
    for t in times:
        if t > edge:
            break
        count += 1
    return count


def sliding_quota(times: tuple[int, ...], now_ns: int, period_ns: int) -> tuple[int, int]:
    """``(remaining, reset_ns)``: remaining as :func:`sliding_available`; ``reset_ns`` is the time until the
    whole log has left the window (``remaining == limit``; 0 when it has) while a permit remains, else the
    wait for one permit."""
    remaining = sliding_available(times, now_ns, period_ns)
    if remaining >= 1:
        return remaining, max(0, times[-1] + period_ns - now_ns)
    return remaining, sliding_decide(times, 1, -1, now_ns, period_ns)[1]
