"""The services' cores as the tests build them: from the fleet's defaults, with roundtrip.testing's in-memory ports
where a test does not bring its own."""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from typing import Any

from roundtrip._executor.core import ExecutorCore
from roundtrip._executor.runner import Runner
from roundtrip._guard.core import Guard, GuardPorts, Timing
from roundtrip._guard.loop import Decisions
from roundtrip._guard.rules import Policy
from roundtrip._guard.side_effects import SideEffects
from roundtrip._kernel.clock import SYSTEM, Clock
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.storage.prices import PriceTable
from roundtrip._kernel.wire.approvals import DecisionVerifier, Verifier
from roundtrip._kernel.wire.events import ApprovalRequested, CallModel, ExecuteToolBatch, ModelResponded
from roundtrip._model.capacity import Capacity
from roundtrip._model.core import ModelCore, ModelPorts, core_of
from roundtrip._model.streamed import Chunks
from roundtrip.testing._ports import OpenFence
from tests.signing import pair

MAX_TRANSCRIPT_BYTES = Settings(_env_file=None).max_transcript_bytes


def new_capacity(
    clock: Clock = SYSTEM, rng: random.Random | None = None, slow_start: bool = True, **rest: Any
) -> Capacity:
    """The model's limiter as the fleet builds it (the system's clock, fresh jitter, a slow start), but what a test
    sets."""
    return Capacity(clock, rng or random.Random(), slow_start, **rest)


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
        new_capacity() if capacity is None else capacity,
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
    return await core.handle(batch, _kept)


def guard(
    ledger: Any,
    policy: Policy,
    prices: PriceTable,
    publish: Any,
    *,
    model: str = "",
    stuck_after_s: float = 60.0,
    stuck_grace_s: float = 30.0,
    turn_deadline_s: float = 300.0,
    outbox_after_s: float = 5.0,
    conversations: Any = None,
    wait_poll_s: float = 0.5,
    decisions: DecisionVerifier | None = None,
    holds: Verifier | None = None,
    agent_digest: str = "",
    side_effects: SideEffects | None = None,
    progress: Mapping[str, str] | None = None,
    streams_by_default: bool = False,
) -> Guard:
    """The guard's core over these stores, with the fleet's defaults for what a test leaves out: keys of a pair of
    its own (a decision or hold signed by anyone else is refused), no tool a side effect."""
    return Guard(
        GuardPorts(ledger, conversations, publish),
        Decisions(
            policy,
            prices,
            model,
            SideEffects(frozenset(), None, policy.replies) if side_effects is None else side_effects,
        ),
        Timing(stuck_after_s, stuck_grace_s, turn_deadline_s, outbox_after_s, wait_poll_s),
        pair("guard-tests").decisions if decisions is None else decisions,
        pair("guard-tests").verifier if holds is None else holds,
        agent_digest,
        {} if progress is None else progress,
        streams_by_default,
    )


async def _kept(_: Any) -> None:
    """The executor core's publisher in these tests: the command is what `handle` returns."""


def refused_once(capacity: Capacity, retry_after: float | None, started_at: float, overloaded: bool = False) -> float:
    """`Capacity.refused` for a call's first refusal in a row (attempts.py counts them): its pause."""
    return capacity.refused(retry_after, started_at, 1, overloaded=overloaded)
