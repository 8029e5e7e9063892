"""The key-ordered consumer as the tests build it: one subscription's values, but what a test sets."""

from __future__ import annotations

from typing import Any

from roundtrip._kernel.kafka.consumer import KeyOrderedConsumer, Process


def key_ordered(process: Process, **options: Any) -> KeyOrderedConsumer:
    values: dict[str, Any] = {
        "name": "consumer",
        "max_in_flight": 256,
        "commit_interval_s": 0.1,
        "commit": None,
        "rescue": None,
        "forget": None,
        "idle_wait_ms": 5000,
        "cancel_on_revoke": False,
    }
    return KeyOrderedConsumer(process, **{**values, **options})
