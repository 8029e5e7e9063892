"""The gate service: turn.tool_calls -> (validate, authorize, sign) -> turn.tool_batches."""

from __future__ import annotations

import logging

from faststream import FastStream

from roundtrip._gate.of_agent import gate_for
from roundtrip._gate.recorded import RecordedTurns
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.shell import Shell
from roundtrip._kernel.storage.turnstore import TurnStore
from roundtrip._kernel.wire import topics, topology
from roundtrip._kernel.wire.events import CheckToolCalls, ExecuteToolBatch
from roundtrip._sdk.agent import Agent

log = logging.getLogger("roundtrip.gate")
GATE_POOL_SIZE = 2  # one short read per turn per replica, then remembered (deploy/README.md, "Database connections")


def build(settings: Settings, agent: Agent) -> FastStream:
    shell = Shell("gate", settings, log, agent_digest=agent.digest)
    execute = shell.outlet(topics.TOOL_BATCHES, ExecuteToolBatch)
    deps = agent.open_dependencies(settings)
    gate = gate_for(agent, settings, deps)

    @shell.subscribe(topics.TOOL_CALLS)
    async def on_check_tool_calls(command: CheckToolCalls) -> None:
        # authorized for the turn the ledger recorded at its start; a copy naming anyone else is refused here
        turn = await turns().authorized(command.turn)
        batch = await gate.check(command.model_copy(update={"turn": turn}))
        rejected = [c.name for c in batch.calls if not c.approved]
        if rejected:
            log.info("turn %s step %d: rejected %s", command.turn.turn_id, command.step, rejected)
        await execute(batch, command.turn.conversation_id)

    app = shell.app
    app.on_startup(lambda: settings.refuse_unfit_keys("gate", topology.service("gate").keys, agent.holds_calls()))
    agent.toolbox.run_with(app)
    shell.closes(deps.aclose)
    turns = shell.opens("the ledger", lambda: _recorded(settings), lambda recorded: recorded.store.close())
    return app


async def _recorded(settings: Settings) -> RecordedTurns:
    return RecordedTurns(await TurnStore.open(settings.ledger_db_url, pool_size=GATE_POOL_SIZE))
