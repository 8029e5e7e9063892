"""What a persona sees: the current turn of a (validated) request, read into plain values.

A turn opens with the latest user message that carries words rather than tool results; each later tool_use message
and the tool_result message answering it is one `Step`. Personas are pure functions of this `Transcript`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any

# Intent of the customer's words, tried in this order (first match wins).
INTENTS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("cancel", re.compile(r"\bcancel")),
    ("track", re.compile(r"\bwhere\b|\btrack|\bship|\bdeliver")),
    ("help", re.compile(r"\brefund|\bpolic(y|ies)\b|\breturn|\bhelp\b|\bhow\b")),
    ("human", re.compile(r"\bhuman|\bagent|\bperson\b|\bpeople\b")),
)


def intent_of(text: str) -> str:
    """cancel | track | help | human | list."""
    lowered = text.lower()
    for intent, pattern in INTENTS:
        if pattern.search(lowered):
            return intent
    return "list"


@dataclass(frozen=True)
class Call:
    id: str
    name: str
    input: dict[str, Any]


@dataclass(frozen=True)
class Result:
    """A tool_use and the tool_result that answered it."""

    call: Call
    is_error: bool
    text: str
    data: Any

    @property
    def name(self) -> str:
        return self.call.name


@dataclass(frozen=True)
class Step:
    """One model response's tool calls and their results, in the order the model called them."""

    results: tuple[Result, ...]

    @property
    def failed(self) -> bool:
        return any(r.is_error for r in self.results)

    @property
    def calls(self) -> tuple[Call, ...]:
        return tuple(r.call for r in self.results)

    def get(self, name: str) -> Result | None:
        """The first result of tool `name` in this step, if it was called."""
        return next((r for r in self.results if r.name == name), None)

    def errors(self) -> list[Result]:
        return [r for r in self.results if r.is_error]


@dataclass(frozen=True)
class Transcript:
    request: str
    first_user_text: str  # the very first user message's text (for `mix`)
    steps: tuple[Step, ...]
    tools: frozenset[str]
    stop_sequences: tuple[str, ...] = ()
    earlier: tuple[Step, ...] = ()
    said_before: str = ""

    @property
    def intent(self) -> str:
        return intent_of(self.request)

    @property
    def last(self) -> Step | None:
        """The most recent step (None at the start of the turn)."""
        return self.steps[-1] if self.steps else None

    def without_last(self) -> Transcript:
        return replace(self, steps=self.steps[:-1])

    def called(self, name: str) -> bool:
        return any(r.name == name for step in self.steps for r in step.results)

    @classmethod
    def from_request(cls, body: dict[str, Any]) -> Transcript:
        messages = body["messages"]
        opener = 0
        for i, message in enumerate(messages):
            if message["role"] == "user" and not _tool_results(message):
                opener = i
        tools = frozenset(t["name"] for t in body.get("tools") or [])
        said = [text_of(m) for m in messages[:opener] if m["role"] == "assistant" and text_of(m).strip()]
        return cls(
            request=text_of(messages[opener]),
            first_user_text=text_of(messages[0]),
            steps=_steps(messages, opener + 1, len(messages)),
            tools=tools,
            stop_sequences=tuple(body.get("stop_sequences") or ()),
            earlier=_steps(messages, 0, opener),
            said_before=said[-1] if said else "",
        )


def _steps(messages: list[dict[str, Any]], start: int, stop: int) -> tuple[Step, ...]:
    """The steps (a tool_use message and the tool_result message after it) in messages[start:stop]."""
    steps = []
    for i in range(max(0, start), min(stop, len(messages)) - 1):
        assistant, user = messages[i], messages[i + 1]
        if assistant["role"] != "assistant":
            continue
        uses = [b for b in _blocks(assistant) if b.get("type") == "tool_use"]
        if not uses:
            continue
        results = {b["tool_use_id"]: b for b in _tool_results(user)}
        steps.append(Step(tuple(_result(use, results.get(use["id"])) for use in uses)))
    return tuple(steps)


def text_of(message: dict[str, Any]) -> str:
    content = message["content"]
    if isinstance(content, str):
        return content
    return "\n".join(b["text"] for b in content if b.get("type") == "text")


def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    return message["content"] if isinstance(message["content"], list) else []


def _tool_results(message: dict[str, Any]) -> list[dict[str, Any]]:
    return [b for b in _blocks(message) if b.get("type") == "tool_result"]


def _result(use: dict[str, Any], block: dict[str, Any] | None) -> Result:
    call = Call(use["id"], use["name"], use["input"])
    if block is None:  # cannot happen after validation; treat as a failure
        return Result(call, True, "no result", None)
    content = block.get("content")
    if isinstance(content, list):
        text = "\n".join(b.get("text", "") for b in content if b.get("type") == "text")
    else:
        text = content or ""
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    return Result(call, bool(block.get("is_error")), text, data)
