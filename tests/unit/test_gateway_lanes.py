"""The gateway's part of the batch lane: the request's lane (or the fleet's default) into the Turn, a batch turn's own
deadline, its own admission beside the interactive turns', and the platforms without Message Batches."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from roundtrip._gateway.admission import Admission, Lanes
from roundtrip._gateway.core import GatewayPorts, core_of
from roundtrip._kernel.settings import ConfigurationError, Settings
from roundtrip._kernel.wire.events import StartTurn, SupportRequest

AGENT = SimpleNamespace(name="support-agent", digest="d1", model_for=lambda settings: settings.model)


def request(n: int, **fields) -> SupportRequest:
    return SupportRequest(
        request_id=f"req_{n}", conversation_id=f"conv_{n}", customer_id="cus_1001", text="Where is my parcel?", **fields
    )


class Gateway:
    def __init__(self, interactive_limit: int = 10, **settings) -> None:
        self.settings = Settings(_env_file=None, **settings)
        self.lanes = Lanes(Admission(interactive_limit, forget_after_s=600), Admission(100, forget_after_s=600))
        self.started: list[StartTurn] = []

        async def start(command: StartTurn, key: str) -> None:
            self.started.append(command)

        self.core = core_of(self.settings, AGENT, GatewayPorts(self.lanes, None, None, start, None))

    async def ask(self, asked: SupportRequest) -> None:
        await self.core.start(asked, asked.conversation_id.encode())


async def test_a_batch_request_starts_a_batch_turn_with_the_batch_deadline_and_others_stay_interactive():
    gateway = Gateway(batch_deadline_s=7200)
    await gateway.ask(request(1, lane="batch"))
    await gateway.ask(request(2))
    await gateway.ask(request(3, lane="interactive"))
    batch, plain, interactive = (c.turn for c in gateway.started)
    assert batch.lane == "batch" and batch.deadline_at == pytest.approx(batch.started_at + 7200, abs=0.01)
    assert (plain.lane, plain.deadline_at) == ("interactive", 0.0)  # the guard gives an interactive turn its own
    assert (interactive.lane, interactive.deadline_at) == ("interactive", 0.0)


async def test_the_default_lane_is_the_fleets_setting_and_a_request_may_leave_it():
    gateway = Gateway(default_lane="batch")
    await gateway.ask(request(1))
    await gateway.ask(request(2, lane="interactive"))
    assert [c.turn.lane for c in gateway.started] == ["batch", "interactive"]


async def test_batch_turns_take_no_slot_of_the_interactive_turns():
    gateway = Gateway(interactive_limit=1)
    await gateway.ask(request(1))
    waiting = asyncio.create_task(gateway.ask(request(2)))
    for n in range(3, 6):
        await asyncio.wait_for(gateway.ask(request(n, lane="batch")), 1)  # admitted at once beside the full lane
    await asyncio.sleep(0.05)  # the window the second interactive request would (wrongly) have started in
    assert not waiting.done() and gateway.lanes.batch.running == 3
    gateway.lanes.release(gateway.started[0].turn.turn_id)
    await asyncio.wait_for(waiting, 1)
    assert [c.turn.lane for c in gateway.started] == ["interactive", "batch", "batch", "batch", "interactive"]


@pytest.mark.parametrize("provider", ["bedrock", "vertex", "foundry"])
async def test_a_platform_without_message_batches_runs_a_batch_request_interactive_and_refuses_the_default(provider):
    gateway = Gateway(model_provider=provider)
    await gateway.ask(request(1, lane="batch"))
    assert [c.turn.lane for c in gateway.started] == ["interactive"]
    gateway.settings.refuse_unavailable_lane("gateway")  # the default (interactive) is fine anywhere
    refusing = Settings(_env_file=None, model_provider=provider, default_lane="batch")
    with pytest.raises(ConfigurationError) as refused:
        refusing.refuse_unavailable_lane("model")
    said = str(refused.value)
    assert "\n" not in said and said.startswith("model refuses to start: ROUNDTRIP_DEFAULT_LANE=batch")
    assert f"ROUNDTRIP_MODEL_PROVIDER={provider}" in said
    Settings(_env_file=None, default_lane="batch").refuse_unavailable_lane("model")  # the Anthropic API has them


def test_roundtrip_run_gateway_refuses_a_default_batch_lane_without_message_batches_in_one_line(monkeypatch, tmp_path):
    import os

    from typer.testing import CliRunner

    from roundtrip._cli.main import app
    from roundtrip._kernel.settings import get_settings

    for name in [n for n in os.environ if n.startswith("ROUNDTRIP_")]:
        monkeypatch.delenv(name)
    for name, value in (("ENV", "development"), ("STATE_DIR", str(tmp_path)), ("MODEL_PROVIDER", "vertex")):
        monkeypatch.setenv(f"ROUNDTRIP_{name}", value)
    monkeypatch.setenv("ROUNDTRIP_DEFAULT_LANE", "batch")
    get_settings.cache_clear()
    try:
        done = CliRunner().invoke(app, ["run", "gateway"])
    finally:
        get_settings.cache_clear()
    assert done.exit_code == 1, done.output
    (line,) = [line for line in done.output.splitlines() if line.strip()]
    assert line.startswith("error: gateway refuses to start: ROUNDTRIP_DEFAULT_LANE=batch, but ROUNDTRIP_MODEL_PROV")
