"""The fleet and roundtrip.testing run the same core objects: a change to one core method shows in the model service's
handler (its app on the real broker, its fence on a real ledger file) and in `run_turn` alike."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer
from faststream import TestApp

from roundtrip import load_agent
from roundtrip._gateway import core as gateway_core
from roundtrip._gateway.core import GatewayCore
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import CallModel, ModelResponded, SupportReply, SupportRequest, Turn, TurnEnded
from roundtrip._model import app as model_app
from roundtrip._model.core import ModelCore
from roundtrip.testing import ScriptedModel, run_turn
from tests.databases import migrated

pytestmark = pytest.mark.integration

TURN = Turn(turn_id="turn_core", request_id="req_core", conversation_id="conv_core", customer_id="cus_1001")
SAID = "said by the patched core"


async def said_by_the_patch(self: ModelCore, command: CallModel, chunks: object) -> ModelResponded:
    return ModelResponded(
        turn=command.turn,
        step=command.step + 1,
        messages=command.messages,
        content=[{"type": "text", "text": SAID}],
        stop_reason="end_turn",
        model="scripted",
    )


@pytest.fixture
def patched(monkeypatch):
    monkeypatch.setattr(ModelCore, "respond", said_by_the_patch)


async def fleet_iteration(settings: Settings) -> ModelResponded:
    """What the model service publishes on turn.iterations for one message of turn.model_calls."""
    app = model_app.build(settings, load_agent(None))
    iterations = AIOKafkaConsumer(
        topics.t(topics.ITERATIONS, settings.topic_prefix),
        bootstrap_servers=settings.bootstrap_servers,
        auto_offset_reset="earliest",
    )
    await iterations.start()
    try:
        async with TestApp(app):
            command = CallModel(turn=TURN, step=0, messages=[{"role": "user", "content": "hi"}])
            await app.broker.publish(
                command, topic=topics.t(topics.MODEL_CALLS, settings.topic_prefix), key=b"conv_core"
            )
            record = await asyncio.wait_for(iterations.getone(), 30)
    finally:
        await iterations.stop()
    return ModelResponded.model_validate_json(record.value)


async def test_the_fleets_handler_runs_the_core_the_patch_changed(patched, tmp_path, kafka_bootstrap, kafka_topics):
    url = await migrated(f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}")
    settings = Settings(
        _env_file=None,
        env="development",  # the embedded broker's plaintext listener, as the other fleet tests run it
        state_dir=tmp_path,
        ledger_database_url=url,
        kafka_bootstrap_servers=kafka_bootstrap,
        topic_prefix=kafka_topics,
    )
    event = await fleet_iteration(settings)
    assert event.content == [{"type": "text", "text": SAID}] and event.turn.turn_id == TURN.turn_id


def test_run_turn_runs_the_core_the_patch_changed(patched):
    result = run_turn(load_agent(None), "cus_1001", "hi", model=ScriptedModel(["the script's own answer"]))
    assert (result.outcome, result.text) == ("end_turn", SAID)


def test_without_the_patch_run_turn_says_what_the_script_says():
    """The patch is what changed the answer above."""
    result = run_turn(load_agent(None), "cus_1001", "hi", model=ScriptedModel(["the script's own answer"]))
    assert result.text == "the script's own answer"


def test_run_turn_starts_and_answers_through_the_gateways_core(monkeypatch):
    """The turn starts as the gateway's core starts it and its reply is the one the core sends (`reply_for`, after
    its check against the end the rules decided), not a copy of it."""
    started: list[str] = []
    original_start, original_reply_for = GatewayCore.start, gateway_core.reply_for

    async def start(self: GatewayCore, request: SupportRequest, key: bytes | None) -> None:
        started.append(request.customer_id)
        await original_start(self, request, key)

    def reply_for(ended: TurnEnded) -> SupportReply:
        return original_reply_for(ended).model_copy(update={"text": "sent by the gateway's core"})

    monkeypatch.setattr(GatewayCore, "start", start)
    monkeypatch.setattr(gateway_core, "reply_for", reply_for)
    result = run_turn(load_agent(None), "cus_1001", "hi", model=ScriptedModel(["the script's own answer"]))
    assert (started, result.outcome, result.text) == (["cus_1001"], "end_turn", "sent by the gateway's core")
