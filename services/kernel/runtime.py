"""What a long-running service process sets once it has started: the garbage collector.

A service holds 70,000-230,000 objects from start-up on (the SDK, SQLAlchemy, OpenTelemetry,
pydantic's schemas), alive as long as the process. CPython's full collection walks every one of
them, with the event loop stopped: ~100 ms in the model service, every few seconds under load
(measured: 2.2 s of the model service's CPU in a 3,600-turn benchmark run, docs/benchmarks.md).
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
