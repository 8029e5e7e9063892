"""The model service: turn.model_calls -> (Messages API) -> turn.iterations."""

from __future__ import annotations

import logging

from faststream import FastStream

from services.kernel import topics
from services.kernel.events import CallModel, ModelResponded
from services.kernel.messaging import Outlet, make_broker, service_app, subscribe
from services.kernel.settings import Settings
from services.model.client import ModelClient
from services.model.handlers import call_model
from services.tools.registry import load_registry

log = logging.getLogger("roundtrip.model")


def build(settings: Settings) -> FastStream:
    broker = make_broker("model", settings)
    responded = Outlet(broker, topics.ITERATIONS, ModelResponded)
    client = ModelClient(settings, load_registry().api_tools(cache=True))

    @subscribe(broker, topics.MODEL_CALLS, "model", settings)
    async def on_call_model(command: CallModel) -> None:
        event = await call_model(command, client)
        if event.error:
            log.warning("turn %s step %d: model call failed: %s", command.turn.turn_id, event.step, event.error)
        await responded(event, command.turn.conversation_id)

    app = service_app(broker, log)
    app.after_shutdown(client.aclose)
    return app
