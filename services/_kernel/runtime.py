"""What a long-running service process does once it has started: say so to its supervisor, settle its heap.

**Ready.** A supervisor that starts a service (`roundtrip up`, services/_fleet/launcher.py) hands it the write end of a
pipe in `ROUNDTRIP_READY_FD`; `announce_ready()` writes one line to it once the service has started and
closes it. The supervisor waits on the read end: readiness is the service's own word, whatever the log level,
and a line from an earlier run of the same folder can never count. Outside a supervisor nothing is set and
nothing happens (Kubernetes and Compose ask /readyz instead).

**The heap.**
A service holds a large heap from start-up on (the SDK, SQLAlchemy, OpenTelemetry, pydantic's
schemas), alive as long as the process. CPython's full collection walks every object of it, with
the event loop stopped, every few seconds under load: long pauses and seconds of CPU
(docs/decisions/process-runtime.md).
`settle_heap()`, called when start-up is done, moves them out of the collector's reach
(`gc.freeze`) and lets the youngest generation grow to 10,000 objects (from 700) before it is
collected, so most of a message's short-lived objects are gone by then.

**The loop.** `run_loop()` runs a service's main coroutine on uvloop, asyncio's event loop on libuv, where it is
installed (a dependency on every platform but Windows), else on asyncio's own: it costs the five services less CPU
per turn (docs/decisions/process-runtime.md).
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
