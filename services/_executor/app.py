"""The executor service: turn.tool_batches -> (run approved calls) -> turn.model_calls.

It scales on its own: more replicas in its group, more partitions of turn.tool_batches. The core (core.py) runs each
batch; the shell publishes what comes of it.
"""

from __future__ import annotations

import logging

from faststream import FastStream

from roundtrip._executor.core import ExecutorPorts, core_of
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.shell import Shell
from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import ApprovalRequested, CallModel, ExecuteToolBatch
from roundtrip._sdk.agent import Agent

log = logging.getLogger("roundtrip.executor")


def build(settings: Settings, agent: Agent) -> FastStream:
    shell = Shell("executor", settings, log, agent.digest, agent.holds_calls())
    agent.toolbox.run_with(shell.app)  # the MCP tools, started before the handlers run
    call_model = shell.outlet(topics.MODEL_CALLS, CallModel)
    request_approval = shell.outlet(topics.APPROVAL_REQUESTS, ApprovalRequested)
    deps = agent.open_dependencies(settings)
    shell.closes(deps.aclose)
    core = core_of(settings, agent, ExecutorPorts(shell.fence(), deps))

    @shell.subscribe(topics.TOOL_BATCHES)
    async def on_execute_tool_batch(batch: ExecuteToolBatch) -> None:
        async def send(command: CallModel | ApprovalRequested) -> None:
            if isinstance(command, ApprovalRequested):
                await request_approval(command, batch.turn.conversation_id)
            else:
                await call_model(command, batch.turn.conversation_id)

        await core.handle(batch, send)

    return shell.app
