"""The gate service: turn.tool_calls -> (validate, authorize, sign) -> turn.tool_batches.

The core (core.py) checks each step's calls; the shell publishes the signed batch."""

from __future__ import annotations

import logging

from faststream import FastStream

from roundtrip._gate.core import GatePorts, core_of
from roundtrip._gate.recorded import RecordedTurns
from roundtrip._kernel.clock import SYSTEM
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.shell import Opened, Shell
from roundtrip._kernel.storage.turnstore import TurnStore
from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import CheckToolCalls, ExecuteToolBatch, Turn
from roundtrip._sdk.agent import Agent

log = logging.getLogger("roundtrip.gate")
GATE_POOL_SIZE = 2  # one short read per turn per replica, then remembered (deploy/README.md, "Database connections")


def build(settings: Settings, agent: Agent) -> FastStream:
    shell = Shell("gate", settings, log, agent.digest, agent.holds_calls())
    agent.toolbox.run_with(shell.app)  # the MCP tools, started before the handlers run
    execute = shell.outlet(topics.TOOL_BATCHES, ExecuteToolBatch)
    deps = agent.open_dependencies(settings)
    shell.closes(deps.aclose)
    turns = shell.opens("the ledger", lambda: _recorded(settings), lambda recorded: recorded.store.close())
    core = core_of(settings, agent, GatePorts(_OpenedTurns(turns), deps))

    @shell.subscribe(topics.TOOL_CALLS)
    async def on_check_tool_calls(command: CheckToolCalls) -> None:
        await execute(await core.handle(command), command.turn.conversation_id)

    return shell.app


class _OpenedTurns:
    """The recorded turns the core is built with before the shell opens the ledger at start."""

    def __init__(self, opened: Opened[RecordedTurns]) -> None:
        self.opened = opened

    async def authorized(self, turn: Turn) -> Turn:
        return await self.opened().authorized(turn)


async def _recorded(settings: Settings) -> RecordedTurns:
    return RecordedTurns(await TurnStore.open(settings.ledger_db_url, pool_size=GATE_POOL_SIZE), SYSTEM)
