"""The executor's core: one signed ExecuteToolBatch in; the turn's next CallModel, or its ApprovalRequested when a call
waits for a person, out (None: a duplicate, or a batch too late to run).

Built once by `core_of`, run by the service's shell (app.py) per message of turn.tool_batches and by
roundtrip.testing's in-process loop per batch; the fence (the ledger in the fleet) and the agent's dependencies come
in its ports.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from opentelemetry import trace

from roundtrip._executor.batches import BatchFence, BatchNotRun, next_command, run_calls, verify
from roundtrip._executor.runner import Runner
from roundtrip._kernel.clock import SYSTEM
from roundtrip._kernel.kafka.dedupe import SeenIds
from roundtrip._kernel.observability.telemetry import mark_error
from roundtrip._kernel.wire.approvals import Verifier
from roundtrip._kernel.wire.events import ApprovalRequested, CallModel, ExecuteToolBatch
from roundtrip._sdk.agent import Agent
from roundtrip._sdk.context import Dependencies

log = logging.getLogger("roundtrip.executor")

# A batch delivered again comes within minutes; past this window the turn fence keeps it from running twice.
DUPLICATE_WINDOW_S = 600.0
UNSENT_KEPT = 10_000  # batches whose calls ran and whose next step could not be recorded or published yet

Send = Callable[[CallModel | ApprovalRequested], Awaitable[None]]  # the shell's publisher of what follows a batch


class RunnerSettings(Protocol):
    """The settings a runner reads: ExecutorSettings' and the largest tool_result block (TranscriptLimits)."""

    tool_timeout_s: float
    parallel_tools: bool
    max_block_bytes: int


def runner_for(settings: RunnerSettings, agent: Agent, deps: Dependencies) -> Runner:
    """What runs the calls of a batch: the agent's handlers (its MCP tools by the toolbox), with the fleet's limits."""
    return Runner(
        agent.registry,
        deps,
        settings.tool_timeout_s,
        settings.parallel_tools,
        settings.max_block_bytes,
        fallback=agent.toolbox.handler,
    )


class ExecutorConcerns(RunnerSettings, Protocol):
    """The settings the executor's core reads: the runner's, the gate's public keys, the transcript's limit."""

    batch_verify_keys: str
    max_transcript_bytes: int


@dataclass(frozen=True)
class ExecutorPorts:
    fence: BatchFence
    deps: Dependencies  # the agent's clients, opened by the shell (or the in-process loop)


class ExecutorCore:
    def __init__(self, runner: Runner, batches: Verifier, fence: BatchFence, max_transcript_bytes: int) -> None:
        self.runner, self.batches, self.fence = runner, batches, fence
        self.max_transcript_bytes = max_transcript_bytes
        self.seen = SeenIds(SYSTEM, max_age_s=DUPLICATE_WINDOW_S)
        # calls that ran while what follows them failed (the database away): the batch's retry hands these on
        # instead of running the calls again
        self.unsent: dict[str, list[dict[str, Any]]] = {}

    async def handle(self, batch: ExecuteToolBatch, send: Send) -> CallModel | ApprovalRequested | None:
        """The batch run, what follows it sent by `send` and returned: the signature first (a forged batch reusing a
        real turn and step is refused, raising, never mistaken for a duplicate), then duplicates, then the run. The
        batch counts as seen only once `send` returned: a retry after a failed publish hands the results on."""
        verify(batch, self.batches)
        # a step resumed after a person's approval is a second batch of the same step
        key = f"{batch.turn.turn_id}:{batch.step}" + ":resumed" * any(c.approved_by for c in batch.calls)
        if key in self.seen:
            log.info("duplicate batch for turn %s step %d dropped", batch.turn.turn_id, batch.step)
            trace.get_current_span().add_event("duplicate batch dropped")
            return None
        ran = self.unsent.pop(key, None)
        if ran is None:
            try:
                ran = await run_calls(batch, self.runner, self.fence)
            except BatchNotRun as exc:
                _not_run(batch, exc)
                return None
        else:
            trace.get_current_span().add_event("calls ran before: their results handed on, not run again")
        try:
            command = await next_command(batch, ran, self.runner, self.fence, self.max_transcript_bytes)
            await send(command)
        except BaseException:
            self._keep(key, ran)
            raise
        self.seen.add(key)
        if isinstance(command, ApprovalRequested):
            _waits(command)
        return command

    def _keep(self, key: str, ran: list[dict[str, Any]]) -> None:
        self.unsent[key] = ran
        while len(self.unsent) > UNSENT_KEPT:
            del self.unsent[next(iter(self.unsent))]


def core_of(settings: ExecutorConcerns, agent: Agent, ports: ExecutorPorts) -> ExecutorCore:
    """The executor of this agent: its handlers run with the fleet's limits, batches checked with the gate's public
    keys (it cannot sign)."""
    batches = Verifier.of(settings.batch_verify_keys, "ROUNDTRIP_BATCH_VERIFY_KEYS")
    return ExecutorCore(runner_for(settings, agent, ports.deps), batches, ports.fence, settings.max_transcript_bytes)


def _waits(request: ApprovalRequested) -> None:
    log.info(
        "turn %s step %d: %s(%s) waits for approval %s",
        request.turn.turn_id,
        request.step,
        request.call.name,
        request.call.id,
        request.approval_id,
    )


def _not_run(batch: ExecuteToolBatch, exc: BatchNotRun) -> None:
    log.warning("turn %s step %d: not run: %s", batch.turn.turn_id, batch.step, exc)
    span = trace.get_current_span()
    span.set_attribute("roundtrip.detail", f"batch not run: {exc}")
    mark_error(span, f"approval expired: {exc}", "approval_expired")
