"""What a long-running service process does once it has started: say so to its supervisor, settle its heap.

`announce_ready()` writes one line to the pipe a supervisor (`roundtrip up`) handed over in ROUNDTRIP_READY_FD:
readiness is the service's own word, and a line from an earlier run can never count; outside a supervisor nothing
happens (Kubernetes asks /readyz). `settle_heap()` freezes what start-up left alive out of the collector's reach,
and `run_loop()` runs on uvloop where installed (docs/decisions/process-runtime.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
from collections.abc import Coroutine
from typing import Any

READY_FD_ENV = "ROUNDTRIP_READY_FD"
YOUNG_GENERATION_THRESHOLD = 10_000


def settle_heap() -> int:
    """Freeze what start-up left alive and raise the young generation's threshold; returns the objects frozen."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_GENERATION_THRESHOLD, middle, old)
    return gc.get_freeze_count()


def announce_ready(service: str) -> None:
    """Tell the supervisor (if one handed us a pipe) that `service` has started; once per process."""
    fd = os.environ.pop(READY_FD_ENV, None)
    if fd is None or not fd.isdigit():
        return
    with contextlib.suppress(OSError):  # the supervisor went away: nobody to tell
        os.write(int(fd), f"ready {service}\n".encode())
    with contextlib.suppress(OSError):
        os.close(int(fd))


def run_loop(main: Coroutine[Any, Any, Any]) -> Any:
    """Run `main` to its end on uvloop where it is installed, else on asyncio's loop."""
    try:
        import uvloop
    except ImportError:  # Windows, or an install without it: asyncio's own loop
        return asyncio.run(main)
    return uvloop.run(main)
