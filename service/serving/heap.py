"""The objects a server keeps for its life, kept out of the garbage collector's way.

CPython's full collection (generation 2) visits every tracked object that survived the
younger ones, with the GIL held: every thread waits, the decoding loop between two steps
included. Most of what a running server holds is never garbage: the modules it imported
(FastAPI, SQLAlchemy, the document libraries), its models' tokenizers and tables. With them in
the heap, a full collection took 80-95 ms under load (AMD EPYC, 2 cores), about every 30 s, and
each one stalled every request in flight: at 70% load that was the p99
(docs/serving-performance.md, "Garbage collection").

gc.freeze() moves every object that exists into a permanent generation that collections skip;
what requests allocate afterwards is collected as before. `settle` is called once the server
is ready and whenever a model version loads or leaves: it unfreezes first, so that a model
that left can be collected (a frozen object in a reference cycle would never be), collects,
so that no garbage is frozen, then freezes what is left.
"""

from __future__ import annotations

import gc
import logging
import threading
import time

log = logging.getLogger("nmt.heap")

_settling = threading.Lock()  # loads and unloads run on threads of their own


def settle() -> float:
    """Collect, then freeze what survives; returns the seconds it took (one full collection,
    a pause of every thread: done only when the models change)."""
    with _settling:
        started = time.perf_counter()
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        seconds = time.perf_counter() - started
    log.info(
        "heap settled",
        extra={"frozen_objects": gc.get_freeze_count(), "seconds": round(seconds, 3)},
    )
    return seconds
