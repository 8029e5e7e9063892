"""A turn as steps for its page: what the model was told and said (the transcript) joined with what each service
did and how long it took (the turn's trace). Either source may be missing (a running turn keeps no transcript yet;
spans arrive in batches): the page shows what there is."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from roundtrip._kernel.storage.prices import PriceTable
from roundtrip._kernel.wire.events import Usage

ENDINGS = {
    "end_turn": "The model finished its answer.",
    "max_tokens": "The model's answer reached its output token limit.",
    "stop_sequence": "The model's answer reached a stop sequence.",
    "refusal": "The model refused to answer.",
    "model_context_window_exceeded": "The conversation no longer fit the model's context window.",
    "unknown_stop_reason": "The model stopped for a reason the fleet does not know.",
    "step_limit": "The guard ended the turn at its step limit.",
    "repeated_call": "The guard ended the turn: the model repeated a call it had already made (same tool, same input).",
    "cycle": "The guard ended the turn: the model's calls went round in a cycle.",
    "failure_streak": "The guard ended the turn: too many tool calls failed in a row.",
    "budget": "The guard ended the turn: it spent its token budget.",
    "deadline": "The turn passed its deadline.",
    "cancelled": "A person cancelled the turn.",
    "model_error": "The model could not be called.",
    "model_busy": "The model stayed at its rate limit until the turn's deadline.",
    "conversation_refused": "The conversation was refused.",
    "approval_timeout": "Nobody decided a held call before its deadline.",
}


@dataclass
class ModelCall:
    latency_ms: float
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    cost_usd: float | None
    stop_reason: str
    attempts: int


@dataclass
class Call:
    tool_use_id: str
    name: str
    input: Any = None
    verdict: str = ""  # approved, rejected, held ("" while the gate's span has not arrived)
    reason: str = ""
    approved_by: str = ""
    result: Any = None
    is_error: bool = False
    has_result: bool = False
    ran_ms: float | None = None


@dataclass
class Step:
    number: int
    model: ModelCall | None = None
    text: str = ""
    calls: list[Call] = field(default_factory=list)
    decision: str = ""  # the guard's, after this step's model call


@dataclass
class Timeline:
    customer: list[str]
    history: list[dict[str, Any]]
    steps: list[Step]
    ending: str  # the guard's decision at the end, in words ("" while it runs)


def blocks_of(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content or [] if isinstance(b, dict)]


def texts(message: dict[str, Any]) -> str:
    return "\n".join(str(b.get("text", "")) for b in blocks_of(message) if b.get("type") == "text").strip()


def customer_words(messages: list[dict[str, Any]]) -> list[str]:
    """What the customer wrote (user messages with text, not tool results), in order."""
    return [t for m in messages if m.get("role") == "user" and (t := texts(m))]


def last_model_text(messages: list[dict[str, Any]]) -> str:
    return next((texts(m) for m in reversed(messages) if m.get("role") == "assistant"), "")


def result_value(content: Any) -> Any:
    """A tool result as it reads best: JSON text parsed (pretty-printed by the page), a list of text blocks joined."""
    if isinstance(content, list) and all(isinstance(b, dict) and b.get("type") == "text" for b in content):
        content = "\n".join(str(b.get("text", "")) for b in content)
    if isinstance(content, str):
        try:
            return json.loads(content)
        except ValueError:
            return content
    return content


def build(
    messages: list[dict[str, Any]],
    history_messages: int,
    spans: list[dict[str, Any]],
    outcome: str | None,
    prices: PriceTable | None = None,
) -> Timeline:
    own = messages[history_messages:]
    steps: dict[int, Step] = {}

    def step(n: int) -> Step:
        return steps.setdefault(n, Step(n))

    calls: dict[str, Call] = {}
    number = 0
    for message in own:
        if message.get("role") == "assistant":
            number += 1
            current = step(number)
            current.text = texts(message)
            for block in blocks_of(message):
                if block.get("type") == "tool_use":
                    call = Call(str(block.get("id", "")), str(block.get("name", "")), block.get("input"))
                    current.calls.append(call)
                    calls[call.tool_use_id] = call
        for block in blocks_of(message):
            if block.get("type") == "tool_result" and (found := calls.get(str(block.get("tool_use_id")))):
                found.result, found.is_error = result_value(block.get("content")), bool(block.get("is_error"))
                found.has_result = True
    _from_spans(spans, step, calls, prices)
    ending = ""
    if outcome:
        ending = ENDINGS.get(outcome, f"The turn ended: {outcome}.")
        detail = next(
            (
                str(s["attributes"]["roundtrip.detail"])
                for s in sorted(spans, key=lambda s: s["start_ns"], reverse=True)
                if s["attributes"].get("roundtrip.detail") and s["attributes"].get("roundtrip.outcome")
            ),
            "",
        )
        ending += f" {detail}" if detail else ""
    return Timeline(customer_words(own), messages[:history_messages], [steps[n] for n in sorted(steps)], ending)


def _from_spans(
    spans: list[dict[str, Any]], step: Callable[[int], Step], calls: dict[str, Call], prices: PriceTable | None
) -> None:
    model_calls: dict[int, list[dict[str, Any]]] = {}
    for span in sorted(spans, key=lambda s: s["start_ns"]):
        attrs, took = span["attributes"], (span["end_ns"] - span["start_ns"]) / 1e6
        n = attrs.get("roundtrip.step")
        if span["service"] == "roundtrip-model" and attrs.get("gen_ai.operation.name") == "chat" and n:
            model_calls.setdefault(int(n), []).append(span)
        elif span["name"] == "guard.decide" and n:
            step(int(n)).decision = str(attrs.get("roundtrip.decision", ""))
        elif span["name"] == "gate.check_call" and n:
            call = _call(step(int(n)), calls, str(attrs.get("roundtrip.tool_use_id", "")), attrs.get("roundtrip.tool"))
            if attrs.get("roundtrip.hold"):
                call.verdict, call.reason = "held", str(attrs["roundtrip.hold"])
            elif attrs.get("roundtrip.approved"):
                call.verdict, call.reason = "approved", ""
                call.approved_by = str(attrs.get("roundtrip.approved_by", ""))
            else:
                call.verdict = "rejected"
                call.reason = str(span.get("status_message") or "").removeprefix("rejected: ")
        elif span["name"].startswith("execute_tool") and n:
            _call(
                step(int(n)), calls, str(attrs.get("gen_ai.tool.call.id", "")), attrs.get("gen_ai.tool.name")
            ).ran_ms = took
    for n, attempts in model_calls.items():
        last = attempts[-1]
        attrs = last["attributes"]
        # the GenAI conventions count the cached input tokens in gen_ai.usage.input_tokens
        cache_read = int(attrs.get("gen_ai.usage.cache_read.input_tokens") or 0)
        cache_write = int(
            attrs.get("gen_ai.usage.cache_creation.input_tokens")
            or attrs.get("gen_ai.usage.cache_write.input_tokens")
            or 0
        )
        usage = Usage(
            input_tokens=max(0, int(attrs.get("gen_ai.usage.input_tokens") or 0) - cache_read - cache_write),
            output_tokens=int(attrs.get("gen_ai.usage.output_tokens") or 0),
            cache_read_input_tokens=cache_read,
            cache_creation_input_tokens=cache_write,
        )
        reasons = attrs.get("gen_ai.response.finish_reasons") or attrs.get("anthropic.message.stop_reason") or []
        model = str(attrs.get("gen_ai.response.model") or attrs.get("gen_ai.request.model") or "")
        step(n).model = ModelCall(
            latency_ms=(last["end_ns"] - last["start_ns"]) / 1e6,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cache_read_tokens=usage.cache_read_input_tokens,
            cache_write_tokens=usage.cache_creation_input_tokens,
            cost_usd=prices.cost(model, usage) if prices and model else None,
            stop_reason=str(reasons[0] if isinstance(reasons, list) and reasons else reasons or ""),
            attempts=len(attempts),
        )


def _call(step: Step, calls: dict[str, Call], tool_use_id: str, name: Any) -> Call:
    """The call of the transcript with this id, or one the spans alone tell of (the transcript not kept yet)."""
    if tool_use_id not in calls:
        calls[tool_use_id] = Call(tool_use_id, str(name or ""))
        step.calls.append(calls[tool_use_id])
    return calls[tool_use_id]
