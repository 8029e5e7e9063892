"""The model service: turn.model_calls -> (Messages API) -> turn.iterations."""

from __future__ import annotations

import logging

from faststream import FastStream

from services.kernel import topics
from services.kernel.events import CallModel, ModelResponded
from services.kernel.messaging import Outlet, make_broker, service_app, subscribe
from services.kernel.settings import Settings
from services.kernel.turnstore import Fence
from services.model.client import ModelClient
from services.model.handlers import Limits, call_model
from services.tools.agent import current_agent

log = logging.getLogger("roundtrip.model")


def build(settings: Settings) -> FastStream:
    broker = make_broker("model", settings)
    responded = Outlet(broker, topics.ITERATIONS, ModelResponded)
    agent = current_agent(settings.agent)
    # the agent's tools, MCP ones included as their servers are listed (a list kept current in place)
    client = ModelClient(settings, agent.mcp.api_tools, agent.system_prompt, agent.model_for(settings))
    limits = Limits(settings.max_block_bytes, settings.max_input_depth, settings.max_transcript_bytes)

    state: dict[str, Fence] = {}

    @subscribe(broker, topics.MODEL_CALLS, "model", settings)
    async def on_call_model(command: CallModel) -> None:
        event = await call_model(command, client, state["fence"], limits)
        if event is None:
            log.warning("turn %s step %d: model not called: the turn has ended, been cancelled, moved on or passed its deadline",
                        command.turn.turn_id, command.step)
            return
        if event.error:
            log.warning("turn %s step %d: model call failed: %s", command.turn.turn_id, event.step, event.error)
        await responded(event, command.turn.conversation_id)

    app = service_app(broker, log)
    app.on_startup(agent.mcp.start)

    @app.on_startup
    async def open_fence() -> None:
        state["fence"] = await Fence.open(settings.ledger_db_url)

    @app.after_shutdown
    async def close() -> None:
        await agent.mcp.aclose()
        await client.aclose()
        if "fence" in state:
            await state["fence"].close()

    return app
