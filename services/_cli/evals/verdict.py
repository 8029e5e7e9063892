"""What one turn of a case did (read from the fleet's topics), and which of its expectations that breaks."""

from __future__ import annotations

from dataclasses import dataclass, field

from roundtrip._cli.evals.cases import Expect
from roundtrip._kernel.wire.events import SupportReply


@dataclass
class Observed:
    """One turn as the topics told it: the calls the model made, the gate's refusals and holds, and the reply."""

    request_id: str
    calls: dict[str, str] = field(default_factory=dict)  # tool_use id -> tool name, in the order made
    refused: dict[str, tuple[str, str]] = field(default_factory=dict)  # tool_use id -> (tool, the gate's error)
    held: dict[str, tuple[str, str]] = field(default_factory=dict)  # approval id -> (tool, why)
    versions: set[str] = field(default_factory=set)  # the agent versions its model calls were made on ("": default)
    reply: SupportReply | None = None

    @property
    def tools(self) -> list[str]:
        return list(self.calls.values())


def _matches(found: list[tuple[str, str]], tool: str, because: str) -> bool:
    return any(name == tool and because.lower() in why.lower() for name, why in found)


def _expected_calls(kind: str, wanted: tuple[tuple[str, str], ...] | None, found: list[tuple[str, str]]) -> list[str]:
    if wanted is None:
        return []
    if not wanted:
        return [f"no call {kind} expected, got {', '.join(f'{t} ({w})' for t, w in found)}"] if found else []
    said = "; ".join(f"{t}: {w}" for t, w in found) or "none"
    return [
        f"{tool} {kind}" + (f" because of {because!r}" if because else "") + f" expected (calls {kind}: {said})"
        for tool, because in wanted
        if not _matches(found, tool, because)
    ]


def failures(expect: Expect, seen: Observed) -> list[str]:
    """Each expectation the turn broke, as a sentence ([] when it kept them all)."""
    reply = seen.reply
    if reply is None:
        return ["no reply"]
    broken: list[str] = []
    if expect.outcome and reply.outcome.value not in expect.outcome:
        broken.append(f"outcome {reply.outcome.value}, expected {' or '.join(expect.outcome)}")
    tools = seen.tools
    broken += [f"{t} not called (called: {', '.join(tools) or 'none'})" for t in expect.tools_called if t not in tools]
    broken += [f"{t} called" for t in expect.tools_not_called if t in tools]
    broken += _expected_calls("refused", expect.refused, list(seen.refused.values()))
    broken += _expected_calls("held", expect.held, list(seen.held.values()))
    if expect.max_steps is not None and reply.steps > expect.max_steps:
        broken.append(f"{reply.steps} steps, at most {expect.max_steps} expected")
    if expect.max_cost_usd is not None and reply.cost_usd > expect.max_cost_usd:
        broken.append(f"cost ${reply.cost_usd:.4f}, at most ${expect.max_cost_usd:.4f} expected")
    text = reply.text.lower()
    broken += [f"the reply does not say {w!r}" for w in expect.reply_contains if w.lower() not in text]
    broken += [f"the reply says {w!r}" for w in expect.reply_not_contains if w.lower() in text]
    return broken
