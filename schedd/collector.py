"""The cyclic garbage collector paused while a plan runs.

A plan allocates hundreds of thousands of small containers (memo keys, actions, waits)
that nearly all die by reference count when it returns. With the collector on, every
700 of them start a young collection, and as survivors age, full collections walk the
whole heap, the snapshot's tens of thousands of jobs among it: on 10,000 pending jobs
a plan took 151 ms median with it on, 124 ms off (docs/policies.md#planning-speed).
Paused, the plan leaves one young collection of what it kept (its actions and waits)
to the next allocation after it.

The collector is process-wide: a plan in a worker thread pauses it for the event loop's
thread too, for that long. Pauses nest and overlap (counted): the collector comes back
when the last one ends, as it was before the first.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic collector off for the block (for every thread), back as it was when the
    last pause ends."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()
