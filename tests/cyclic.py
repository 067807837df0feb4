"""What a piece of code leaves to the cyclic garbage collector (tests of reference cycles on the request path)."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any


def cyclic_garbage(fn: Callable[[], Any]) -> list[Any]:
    """What ``fn()`` leaves for the cyclic GC (objects only a reference cycle keeps alive)."""
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        fn()
        gc.collect()
        return list(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
