"""The executor service: turn.tool_batches -> (run approved calls) -> turn.model_calls.

It scales on its own: more replicas in its group, more partitions of turn.tool_batches.
"""

from __future__ import annotations

import logging

from faststream import FastStream
from opentelemetry import trace

from roundtrip._executor.batches import BatchNotRun, execute, verify
from roundtrip._executor.runner import runner_for
from roundtrip._kernel.kafka.dedupe import SeenIds
from roundtrip._kernel.observability.telemetry import mark_error
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.shell import Shell
from roundtrip._kernel.wire import topics, topology
from roundtrip._kernel.wire.approvals import Verifier
from roundtrip._kernel.wire.events import ApprovalRequested, CallModel, ExecuteToolBatch
from roundtrip._sdk.agent import Agent

log = logging.getLogger("roundtrip.executor")

# A batch delivered again comes within minutes; past this window the turn fence keeps it from running twice.
DUPLICATE_WINDOW_S = 600.0


def build(settings: Settings, agent: Agent) -> FastStream:
    shell = Shell("executor", settings, log, agent_digest=agent.digest)
    deps = agent.open_dependencies(settings)
    runner = runner_for(settings, agent, deps)
    batches = Verifier.of(settings.batch_verify_keys, "ROUNDTRIP_BATCH_VERIFY_KEYS")  # public keys: it cannot sign
    seen = SeenIds(max_age_s=DUPLICATE_WINDOW_S)
    call_model = shell.outlet(topics.MODEL_CALLS, CallModel)
    request_approval = shell.outlet(topics.APPROVAL_REQUESTS, ApprovalRequested)

    @shell.subscribe(topics.TOOL_BATCHES)
    async def on_execute_tool_batch(batch: ExecuteToolBatch) -> None:
        # the signature first: a forged batch reusing a real turn and step is refused (dead-lettered and
        # logged on roundtrip.security by the raise), never mistaken for a duplicate
        verify(batch, batches)
        # a step resumed after a person's approval is a second batch of the same step
        key = f"{batch.turn.turn_id}:{batch.step}" + ":resumed" * any(c.approved_by for c in batch.calls)
        if key in seen:
            log.info("duplicate batch for turn %s step %d dropped", batch.turn.turn_id, batch.step)
            trace.get_current_span().add_event("duplicate batch dropped")
            return
        try:
            command = await execute(
                batch,
                batches,
                runner,
                fence(),
                verified=True,
                max_transcript_bytes=settings.max_transcript_bytes,
            )
        except BatchNotRun as exc:
            _not_run(batch, exc)
            return
        seen.add(key)
        if isinstance(command, ApprovalRequested):
            _waits(command)
            await request_approval(command, batch.turn.conversation_id)
            return
        await call_model(command, batch.turn.conversation_id)

    app = shell.app
    app.on_startup(lambda: settings.refuse_unfit_keys("executor", topology.service("executor").keys))
    agent.toolbox.run_with(app)
    shell.closes(deps.aclose)
    fence = shell.fence()
    return app


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
