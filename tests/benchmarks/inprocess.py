"""The same loop without Kafka: one asyncio task per turn, in this process.

It is services/testing/_inprocess.py's loop (the one the agent authors' harness runs), with the fleet's own pieces:
ModelClient (the anthropic SDK against the simulator, cached system prompt and tools), the model service's
handler, the guard's rules, the gate's Gate.check (JSON Schema validation, ownership look-ups at the shop,
signing), the executor's handler and Runner (the tool handlers calling the shop). What it leaves out is exactly
what the fleet adds: the broker hops, the events' (de)serialisation, the guard's ledger, the telemetry spans of
each hop, and the processes.

`plain=True` (bench_ratelimit's inprocess phase) makes it the loop a user writes around the SDK: the anthropic SDK
with its default retries (2, each sleeping `retry-after`), no limiter, and any APIError left after them ending
the turn as `model_error`. The turns, their handlers and the guard's rules stay the same.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import anthropic
from httpx_aiohttp import AiohttpTransport

from roundtrip._kernel.settings import Settings
from roundtrip._shop.agent.client import ShopClient
from roundtrip.testing._inprocess import InProcess
from tests.agents import SHOP, shop_deps, shop_model_client
from tests.cores import new_capacity


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
    first_text: float = 0.0  # a streamed turn's: when its first chunk with text was read (support.stream)
    chunks: int = 0  # a streamed turn's chunks on support.stream
    cost_usd: float = 0.0  # the fleet's turns: the reply's cost

    @property
    def latency(self) -> float:
        return self.ended - self.started

    def iterations(self) -> list[float]:
        """Seconds per loop iteration: previous response (or the start) -> this response."""
        marks = [self.started, *self.responses]
        return [b - a for a, b in itertools.pairwise(marks)]


class SdkOnly:
    """A ModelClient as a plain loop holds the SDK: the message only, so the handler's limiter never hears the
    answers' rate-limit headers and paces nothing."""

    def __init__(self, client: Any) -> None:
        self.client, self.model = client, client.model

    async def answer(self, *args: Any, **kwargs: Any) -> tuple[anthropic.types.Message, dict[str, str]]:
        return (await self.client.answer(*args, **kwargs))[0], {}

    async def stream_answer(self, *args: Any, **kwargs: Any) -> tuple[anthropic.types.Message, dict[str, str]]:
        return (await self.client.stream_answer(*args, **kwargs))[0], {}


class InProcessLoop:
    def __init__(self, settings: Settings, plain: bool = False) -> None:
        self.settings = settings
        self.client = shop_model_client(
            settings, sdk_retries=anthropic.DEFAULT_MAX_RETRIES if plain else settings.model_max_retries
        )
        self.shop = ShopClient(settings.shop_base_url, settings.tool_timeout_s, AiohttpTransport())
        deps = shop_deps(self.shop)
        if plain:  # the SDK's own retries only, no limiter, a capacity refusal the call's error at once
            plain_settings = settings.model_copy(update={"model_max_retries": 0})
            capacity = new_capacity(slow_start=False)
            self.loop = InProcess(SHOP, plain_settings, SdkOnly(self.client), capacity, deps, deps, False)
        else:
            self.loop = InProcess(SHOP, settings, self.client, new_capacity(), deps, deps, True)

    async def aclose(self) -> None:
        await self.client.aclose()
        await self.shop.aclose()

    async def turn(self, text: str, customer_id: str, persona: str | None) -> TurnTiming:
        timing = TurnTiming(started=time.perf_counter())

        def answered(event: Any) -> None:  # a model call answered (a refused one ends the turn, uncounted)
            if not event.error:
                timing.responses.append(time.perf_counter())

        ended = await self.loop.turn(text, customer_id, persona, observe=answered)
        timing.ended = time.perf_counter()
        timing.steps, timing.outcome = len(timing.responses), ended.outcome
        return timing
