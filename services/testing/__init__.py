"""Test an agent as the fleet runs it, in this process, with a scripted model: no Kafka, no API key, milliseconds.

    from roundtrip.testing import ScriptedModel, FunctionModel, call, run_turn

    def test_the_customer_closes_their_own_ticket():
        model = ScriptedModel([call("close_ticket", ticket_id="T-1"), "Ticket T-1 is closed."])
        result = run_turn(AGENT, "cus_1", "Please close T-1", model=model)
        assert result.outcome == "end_turn" and result.calls[0].ok

A model answers each call with a str (the answer), `call(tool, **input)`, a list of them (parallel calls) or
`reply(...)`: `ScriptedModel([...])` in order, `FunctionModel(fn)` from `fn(messages, info)`, each keeping `requests`.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic

from roundtrip._kernel.clock import SYSTEM
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire.events import ApprovalRequested
from roundtrip._model.capacity import Capacity
from roundtrip._model.port import CallOptions, Model
from roundtrip._model.streamed import Chunks
from roundtrip._sdk.agent import Agent, load_agent
from roundtrip._sdk.context import Dependencies
from roundtrip.testing._inprocess import AWAITING_APPROVAL, Ended, InProcess

__all__ = [
    "AWAITING_APPROVAL",
    "Call",
    "CallOptions",
    "FunctionModel",
    "Model",
    "ModelInfo",
    "Reply",
    "ScriptExhausted",
    "ScriptedModel",
    "ToolRun",
    "TurnResult",
    "arun_turn",
    "call",
    "reply",
    "run_turn",
]


@dataclass(frozen=True)
class Call:
    tool: str
    input: dict[str, Any]


@dataclass(frozen=True)
class Reply:
    """One response: its texts and calls in order; stop_reason None means tool_use when it has a call, else end_turn."""

    parts: tuple[str | Call, ...]
    stop_reason: str | None = None


Response = str | Call | Sequence[str | Call] | Reply


def call(tool: str, input: Mapping[str, Any] | None = None, /, **fields: Any) -> Call:
    """A call of `tool`: `call("lookup_order", order_id="ord_1")`, or `call("t", {"from": "x"})` for any key."""
    return Call(tool, {**(input or {}), **fields})


def reply(*parts: str | Call, stop_reason: str | None = None) -> Reply:
    """A response with exactly these parts and stop reason (e.g. `reply("I was cut", stop_reason="max_tokens")`)."""
    return Reply(parts, stop_reason)


class ScriptExhausted(AssertionError):
    """The turn asked the model for more responses than the script has."""


@dataclass(frozen=True)
class ModelInfo:
    step: int  # 1 for the turn's first model call
    tools: list[dict[str, Any]]
    system: str


def _as_reply(response: Response) -> Reply:
    if isinstance(response, Reply):
        return response
    if isinstance(response, (str, Call)):
        return Reply((response,))
    return Reply(tuple(response))


def _message(response: Response, step: int, model: str) -> anthropic.types.Message:
    answer = _as_reply(response)
    content = [
        {"type": "text", "text": part}
        if isinstance(part, str)
        else {"type": "tool_use", "id": f"toolu_{step:02d}_{i}", "name": part.tool, "input": part.input}
        for i, part in enumerate(answer.parts)
    ]
    stop = answer.stop_reason or ("tool_use" if any(isinstance(p, Call) for p in answer.parts) else "end_turn")
    return anthropic.types.Message.model_validate(
        {
            "id": f"msg_{step:02d}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
    )


class _Model:
    """The testing models' base: `Model` (the port the model service calls, the SDK's client in the fleet), its
    answers from `respond`."""

    model = "scripted"

    def __init__(self) -> None:
        self.requests: list[list[dict[str, Any]]] = []
        self.tools: list[dict[str, Any]] = []
        self.system = ""

    def bind(self, agent: Agent) -> None:
        self.tools, self.system = agent.registry.api_tools(cache=False), agent.system_prompt

    def respond(self, messages: list[dict[str, Any]], info: ModelInfo) -> Response:
        raise NotImplementedError

    async def answer(
        self, messages: list[dict[str, Any]], options: CallOptions
    ) -> tuple[anthropic.types.Message, Mapping[str, str]]:
        self.requests.append(messages)
        step = len(self.requests)
        return _message(self.respond(messages, ModelInfo(step, self.tools, self.system)), step, self.model), {}

    async def stream_answer(
        self, messages: list[dict[str, Any]], options: CallOptions, chunks: Chunks
    ) -> tuple[anthropic.types.Message, Mapping[str, str]]:
        message, headers = await self.answer(messages, options)
        for block in message.content:
            if block.type == "text":
                chunks.text(block.text)
        return message, headers


class ScriptedModel(_Model):
    def __init__(self, responses: Sequence[Response]) -> None:
        super().__init__()
        self.responses = list(responses)

    def respond(self, messages: list[dict[str, Any]], info: ModelInfo) -> Response:
        if info.step > len(self.responses):
            raise ScriptExhausted(
                f"the turn asked for model response {info.step}, the script has {len(self.responses)}; "
                f"the last message it got: {json.dumps(messages[-1], default=str)[:500]}"
            )
        return self.responses[info.step - 1]


class FunctionModel(_Model):
    def __init__(self, fn: Callable[[list[dict[str, Any]], ModelInfo], Response]) -> None:
        super().__init__()
        self.fn = fn

    def respond(self, messages: list[dict[str, Any]], info: ModelInfo) -> Response:
        return self.fn(messages, info)


@dataclass(frozen=True)
class ToolRun:
    """One tool call of the turn and what it got back (content "" while it waits for a person)."""

    id: str
    tool: str
    input: Any
    content: str
    is_error: bool

    @property
    def ok(self) -> bool:
        return not self.is_error and bool(self.content)

    @property
    def result(self) -> Any:
        try:
            return json.loads(self.content)
        except ValueError:
            return self.content


@dataclass
class TurnResult:
    outcome: str  # the guard's outcome (end_turn, repeated_call, step_limit, ...) or AWAITING_APPROVAL
    text: str  # what the customer reads
    transcript: list[dict[str, Any]]  # every message of the turn, the last response included
    steps: int
    seconds: float
    detail: str = ""
    held: ApprovalRequested | None = None
    approvals: list[ApprovalRequested] = field(default_factory=list)

    @property
    def tool_results(self) -> list[dict[str, Any]]:
        return [
            b
            for m in self.transcript
            if m["role"] == "user" and isinstance(m["content"], list)
            for b in m["content"]
            if b.get("type") == "tool_result"
        ]

    @property
    def calls(self) -> list[ToolRun]:
        results = {b["tool_use_id"]: b for b in self.tool_results}
        uses = [
            b for m in self.transcript if m["role"] == "assistant" for b in m["content"] if b.get("type") == "tool_use"
        ]
        return [
            ToolRun(
                u["id"],
                u["name"],
                u["input"],
                str(results.get(u["id"], {}).get("content", "")),
                bool(results.get(u["id"], {}).get("is_error")),
            )
            for u in uses
        ]


async def arun_turn(
    agent: Agent | str,
    customer_id: str,
    text: str,
    model: Model,
    *,
    deps: Mapping[str, Any] | None = None,
    state_dir: Path | None = None,
    approve: bool | Callable[[ApprovalRequested], bool] | None = None,
    persona: str | None = None,
) -> TurnResult:
    """One turn of `agent` (an Agent or its import string) for `customer_id`. `deps`: clients shared by all its
    parts; else its own are made as the fleet makes them, one instance for the gate and one for the executor.
    `state_dir`: the fleet's state folder, where its dependencies may keep files (default: ROUNDTRIP_STATE_DIR).
    `approve`: True/False decides every held call, a function decides each, None leaves the turn AWAITING_APPROVAL.
    The other fleet settings are the environment's (ROUNDTRIP_*)."""
    agent = (load_agent(agent) if isinstance(agent, str) else agent).check()
    settings = Settings(_env_file=None) if state_dir is None else Settings(_env_file=None, state_dir=state_dir)
    decide = approve if callable(approve) or approve is None else (lambda _: bool(approve))
    started = time.perf_counter()
    if deps is not None:
        executor_clients = gate_clients = Dependencies(deps)
    else:  # the gate's process and the executor's: each its own instance of every client
        gate_clients = agent.open_dependencies(settings)
        executor_clients = agent.open_dependencies(settings)
    try:
        async with agent.toolbox:
            if (bind := getattr(model, "bind", None)) is not None:  # a model shown the agent's tools and prompt
                bind(agent)
            capacity = Capacity(SYSTEM, random.Random(), slow_start=True)
            fleet = InProcess(agent, settings, model, capacity, executor_clients, gate_clients, True)
            ended: Ended = await fleet.turn(text, customer_id, persona, approve=decide)
    finally:
        if deps is None:
            await executor_clients.aclose()
            await gate_clients.aclose()
    return TurnResult(
        ended.outcome,
        ended.text,
        ended.messages,
        ended.steps,
        time.perf_counter() - started,
        ended.detail,
        ended.held,
        ended.approvals,
    )


def run_turn(
    agent: Agent | str,
    customer_id: str,
    text: str,
    model: Model,
    *,
    deps: Mapping[str, Any] | None = None,
    state_dir: Path | None = None,
    approve: bool | Callable[[ApprovalRequested], bool] | None = None,
    persona: str | None = None,
) -> TurnResult:
    """`arun_turn` for a test that is not async (in an async test, `await arun_turn(...)`)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(
            arun_turn(agent, customer_id, text, model, deps=deps, state_dir=state_dir, approve=approve, persona=persona)
        )
    raise RuntimeError("run_turn was called inside a running event loop: use `await arun_turn(...)` there")
