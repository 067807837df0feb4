"""One script for an all-or-nothing decision over Redis limits of several algorithms in one slot (issue 13).

Each algorithm keeps its own script for its own decisions (cycle: ``fast.lua`` + ``decide.lua`` +
``ratelimiter.lua``; ``gcra.lua``; ``sliding_window.lua``), untouched and as fast as before. A decision that
mixes them runs :data:`MIXED_SCRIPT`, composed here at import time from those files' text: each whole script
as a local function whose parameters shadow the globals it reads (``KEYS``, ``ARGV``, ``redis``), then the
driver ``lua/mixed.lua``, which runs every group's take and, when one rejects, the give-backs (op ``"g"``) of
the groups that granted, in the same run: atomic, one round trip whether granted or refused, exact (nothing
runs between a take and its give-back). See ``mixed.lua`` for the arguments and the reply; the reply has the
cycle script's all-or-nothing shape, so :func:`~.redis.mixed_many` reads it as before.

Limits in several cluster slots cannot share a script run: :func:`~.redis.mixed_many` still splits those.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any

__all__ = ["CYCLE_FILES", "MIXED_SCRIPT", "MIXED_SCRIPT_SHA", "lua_text", "mixed_args", "mixed_reply"]

#: The cycle limiters' script, in this order (the start of ``redis.SCRIPT``).
CYCLE_FILES = ("fast.lua", "decide.lua", "ratelimiter.lua")

# Each algorithm's files, and the local function the composed script wraps them in.
_PARTS = (("r4_cycle", CYCLE_FILES), ("r4_gcra", ("gcra.lua",)), ("r4_sliding", ("sliding_window.lua",)))
# The kind mixed.lua dispatches on, per script file (None: a cycle limiter).
_KINDS = {None: b"c", "gcra.lua": b"g", "sliding_window.lua": b"s"}


def lua_text(name: str) -> str:
    """The text of ``lua/<name>`` in this package."""
    return (resources.files(__package__) / "lua" / name).read_text(encoding="utf-8")


def _compose() -> str:
    parts = []
    for function, files in _PARTS:
        body = "\n".join(lua_text(name) for name in files)
        # (a newline before "end": a file may end in a comment)
        parts.append(f"local function {function}(KEYS, ARGV, redis)\n{body}\nend\n")
    return "".join(parts) + lua_text("mixed.lua")


#: The composed script's source and SHA1 (for EVALSHA; loaded with EVAL on NOSCRIPT like the others).
MIXED_SCRIPT = _compose()
MIXED_SCRIPT_SHA = hashlib.sha1(MIXED_SCRIPT.encode("utf-8")).hexdigest()


def mixed_args(
    members: Sequence[Any], groups: Sequence[Sequence[int]], permits: int, op: bytes, client_now: Callable[[], list[Any]]
) -> tuple[list[int], int, list[Any], int]:
    """``(order, numkeys, keys + arguments, index of the deadline slot)`` of one run of :data:`MIXED_SCRIPT`
    over ``members`` (``redis._Member``) grouped by algorithm (``groups``: member indexes); ``order`` lists the
    member indexes in the script's order (group after group). ``client_now``: the caller clock's ARGV tail
    (``[]`` on server time)."""
    order = [i for group in groups for i in group]
    keys: list[Any] = []
    args: list[Any] = [op, permits, len(groups)]
    for group in groups:
        first = members[group[0]]
        args += [_KINDS[None if first.script is None else first.script.filename], len(group)]
        for i in group:
            member = members[i]
            if member.script is None:
                keys += [member.anchor, member.state]
                args += member.phase._limiter_args()
            else:
                keys.append(member.state)
                args.append(member.counter._margs_resp)
    deadline_at = len(keys) + len(args)
    args.append(b"")  # stamped once a connection is held (server time)
    return order, len(keys), keys + args + client_now(), deadline_at


def mixed_reply(order: Sequence[int], reply: Any, op: bytes) -> list[Any]:
    """The script's reply (script order, stale wrapping already settled) in member order, the cycle script's
    ``"m"``/``"M"`` shape: ``[0]`` or ``[worst, its wait, rejecting...]`` (1-based), after ``"M"``'s figures."""
    n = len(order)
    at = 2 * n if op == b"M" else 0
    verdict = reply[at:]
    if verdict[0] != 0:
        verdict = [order[verdict[0] - 1] + 1, verdict[1], *sorted(order[p - 1] + 1 for p in verdict[2:])]
    if op != b"M":
        return list(verdict)
    figures: list[Any] = [0] * (2 * n)
    for p, index in enumerate(order):
        figures[2 * index], figures[2 * index + 1] = reply[2 * p], reply[2 * p + 1]
    return [*figures, *verdict]
