"""Waiting in a test for a condition that nothing announces: polled, in one place, at one documented interval."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

# Short next to every window the tests wait out (a commit interval, a consumer's idle poll of 50 ms, a second of
# start-up), long enough not to busy the event loop the code under test runs on.
POLL_S = 0.02


async def until(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "the condition") -> Any:
    """What `predicate()` returns once it is true; AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not (result := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(POLL_S)  # poll interval: see POLL_S
    return result
