"""Reading and writing a document with Python's cycle collector paused.

A document's parse builds and drops millions of small objects (a 12 MB HTML page: about 3
million), and the collector's full passes walk all of them while they live: 20 passes, 6.3 of
the parse's 21 s, the longest 1.0 s. A pass holds the GIL, so the event loop, on another
thread, stood still that long: `/healthz` took 1.3 s while a page uploaded. The trees are
acyclic (Element keeps no parent), so reference counting frees them without the collector;
pausing it costs nothing but the cyclic garbage other threads make meanwhile, collected when
the last document work ends.
"""

from __future__ import annotations

import gc
import threading
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_running = 0  # document calls between pause and resume, on any thread
_was_enabled = False


def collector_paused(work: Callable[..., T], *args: Any) -> T:
    """work(*args) with the cycle collector off (as long as any such call runs)."""
    global _running, _was_enabled
    with _lock:
        if _running == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _running += 1
    try:
        return work(*args)
    except BaseException as error:
        # The failed call's frames (kept by the traceback, in a cycle with the error) hold
        # what it read: a refused 3 MB page's tree, which the collector, back on, walked for
        # 1.5 s. Their locals go; the traceback still says where it failed.
        _clear_frames(error)
        raise
    finally:
        with _lock:
            _running -= 1
            if _running == 0 and _was_enabled:
                gc.enable()


def _clear_frames(error: BaseException) -> None:
    """The locals of every finished frame in the tracebacks of `error` and of the errors it
    was raised from or during."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)
        pending += [current.__cause__, current.__context__]
