"""What a long-running service process sets once it has started: the garbage collector.

A service holds a large heap from start-up on (the SDK, SQLAlchemy, OpenTelemetry, pydantic's
schemas), alive as long as the process. CPython's full collection walks every object of it, with
the event loop stopped, every few seconds under load: long pauses and seconds of CPU over a
benchmark run (docs/benchmarks.md, "Figures the code points to").
`settle_heap()`, called when start-up is done, moves them out of the collector's reach
(`gc.freeze`) and lets the youngest generation grow to 10,000 objects (from 700) before it is
collected, so most of a message's short-lived objects are gone by then.
"""

from __future__ import annotations

import gc

YOUNG_GENERATION_THRESHOLD = 10_000


def settle_heap() -> int:
    """Freeze what start-up left alive and raise the young generation's threshold; returns the objects frozen."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_GENERATION_THRESHOLD, middle, old)
    return gc.get_freeze_count()
