"""The same loop without Kafka: one asyncio task per turn, in this process.

It does the work the fleet does for a turn, with the fleet's own pieces and nothing more:
ModelClient (the anthropic SDK against the simulator, cached system prompt and tools),
the gate's Gate.check (JSON Schema validation, ownership look-ups at the shop, signing),
the executor's Runner (the tool handlers calling the shop). What it leaves out is exactly
what the fleet adds: the broker hops, the events' (de)serialisation, the guard's ledger,
the telemetry spans of each hop, and the processes.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import anthropic

from services.executor.runner import Runner
from services.gate.handlers import Gate
from services.kernel.approvals import Signer, parse_keys
from services.kernel.events import CheckToolCalls, ToolCall, Turn
from services.kernel.fingerprints import fingerprint
from services.kernel.settings import Settings
from services.shop.agent.client import ShopClient
from tests.agents import SHOP, shop_deps, shop_model_client


@dataclass
class TurnTiming:
    """One turn: when it started, when each model response was in hand, when it ended (perf_counter s)."""

    started: float
    responses: list[float] = field(default_factory=list)
    ended: float = 0.0
    steps: int = 0
    outcome: str = ""
    conversation_id: str = ""  # the fleet's turns: whose spans say when each response was published
    wall_started: float = 0.0  # time.time() at `started`
    usage: dict = field(default_factory=dict)  # the fleet's turns: the reply's usage

    @property
    def latency(self) -> float:
        return self.ended - self.started

    def iterations(self) -> list[float]:
        """Seconds per loop iteration: previous response (or the start) -> this response."""
        marks = [self.started, *self.responses]
        return [b - a for a, b in zip(marks, marks[1:], strict=False)]


class InProcessLoop:
    def __init__(self, settings: Settings) -> None:
        registry = SHOP.registry
        self.settings = settings
        self.client = shop_model_client(settings, sdk_retries=settings.model_max_retries)  # the SDK retries, as a plain loop would
        self.shop = ShopClient(settings.shop_base_url, timeout=settings.tool_timeout_s)
        shop = self.shop

        async def lookup(kind: str, entity_id: str, customer_id: str) -> Any:
            if kind != "order":
                raise ValueError(f"no lookup for entity kind {kind!r}")
            return await shop.get_order(customer_id, entity_id)

        self.gate = Gate(registry=registry, lookup=lookup, signer=Signer(parse_keys(settings.approval_keys)), deps=shop_deps(shop), agent_settings=SHOP.own_settings)
        self.runner = Runner(registry, shop_deps(shop), settings.tool_timeout_s, settings.parallel_tools)

    async def aclose(self) -> None:
        await self.client.aclose()
        await self.shop.aclose()

    async def turn(self, text: str, customer_id: str, persona: str | None) -> TurnTiming:
        request_id = f"req_{uuid.uuid4().hex[:12]}"
        turn = Turn(
            turn_id=f"turn_{request_id}", request_id=request_id, conversation_id=f"conv_{request_id}",
            customer_id=customer_id, persona=persona, trace_id="",
        )
        timing = TurnTiming(started=time.perf_counter())
        messages: list[dict[str, Any]] = [{"role": "user", "content": text}]
        for step in range(1, self.settings.max_steps + 1):
            try:
                message, _ = await self.client.create(messages, persona)
            except anthropic.APIError:  # after the SDK's retries: the turn fails, as a plain loop's would
                timing.outcome = "model_error"
                break
            timing.responses.append(time.perf_counter())
            timing.steps = step
            content = [block.model_dump(mode="json", exclude_none=True) for block in message.content]
            messages = [*messages, {"role": "assistant", "content": content}]
            if message.stop_reason != "tool_use":
                timing.outcome = message.stop_reason or ""
                break
            calls = [
                ToolCall(id=b.id, name=b.name, input=b.input, fingerprint=fingerprint(b.name, b.input))
                for b in message.content
                if b.type == "tool_use"
            ]
            batch = await self.gate.check(CheckToolCalls(turn=turn, step=step, messages=messages, calls=calls))
            results = await self.runner.run(batch.calls, turn)
            messages = [*messages, {"role": "user", "content": results}]
        else:
            timing.outcome = "max_steps"
        timing.ended = time.perf_counter()
        return timing
