"""The services' cores as the tests build them: from the fleet's defaults, with roundtrip.testing's in-memory ports
where a test does not bring its own."""

from __future__ import annotations

import time
from typing import Any

from roundtrip._executor.core import ExecutorCore
from roundtrip._executor.runner import Runner
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire.approvals import Verifier
from roundtrip._kernel.wire.events import ApprovalRequested, CallModel, ExecuteToolBatch, ModelResponded
from roundtrip._model.capacity import Capacity
from roundtrip._model.core import ModelCore, ModelPorts, core_of
from roundtrip._model.streamed import Chunks
from roundtrip.testing._ports import OpenFence

MAX_TRANSCRIPT_BYTES = Settings(_env_file=None).max_transcript_bytes


def model_core(
    client: Any,
    fence: Any = None,
    settings: Any = None,
    capacity: Capacity | None = None,
    wait_for_capacity: bool = True,
    started_at: float | None = None,
) -> ModelCore:
    ports = ModelPorts(
        client,
        OpenFence() if fence is None else fence,
        Capacity() if capacity is None else capacity,
        wait_for_capacity,
        time.time() if started_at is None else started_at,
    )
    return core_of(Settings(_env_file=None) if settings is None else settings, ports)


async def respond(
    command: CallModel, client: Any, fence: Any = None, chunks: Chunks | None = None, **core: Any
) -> ModelResponded | None:
    """The model core's answer to `command` (`core`: model_core's other arguments)."""
    return await model_core(client, fence, **core).respond(command, chunks)


async def executed(
    batch: ExecuteToolBatch, verifier: Verifier, runner: Runner, fence: Any = None
) -> CallModel | ApprovalRequested | None:
    """The executor core's answer to `batch`, run by `runner` (a fresh core: no batch seen before)."""
    core = ExecutorCore(runner, verifier, OpenFence() if fence is None else fence, MAX_TRANSCRIPT_BYTES)
    return await core.handle(batch)
