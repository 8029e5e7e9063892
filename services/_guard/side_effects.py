"""What a turn did: the side effects that succeeded, for the reply that ends it early.

A side effect is a call of a tool the agent declares serial (`Agent.serial`: it changes something, so it never runs
next to another call) whose tool_result came back without `is_error`. When the fleet ends a turn early (any outcome
but end_turn) after one, the reply says what was done and that nothing more was (`Replies.acted`) instead of an
apology that would have the customer ask for it again. The loop reads them from the turn's own transcript (`done`);
an end from outside the loop, which has no transcript, from what the executor recorded in the turn's row
(`recorded`, services/_kernel/storage/sideeffects.py). What was done is worded by the agent
(`Agent.describe_action(tool, input, result text)`, None for the generic words), else "<tool> succeeded" with the ids of
the entities it named (`shown`: the tool's x-entity fields, ids the customer knows); never the rest of its input, which
may carry internal keys (an idempotency key, a reference the customer never saw).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from roundtrip._guard.replies import DEFAULT, Replies
from roundtrip._guard.rules import results_of
from roundtrip._kernel.storage import sideeffects
from roundtrip._kernel.wire.events import Outcome

log = logging.getLogger("roundtrip.guard")

Describe = Callable[[str, dict[str, Any], str], "str | None"]  # (tool, input, result text) -> what the customer reads


def generic(tool: str, args: dict[str, Any], result: str, fields: Sequence[str] = ()) -> str:
    """The words of a side effect without the agent's: the tool, and the entities it named (only those fields)."""
    shown = ", ".join(f"{key}={str(args[key])[:60]}" for key in fields if key in args)
    return f"{tool} succeeded ({shown})" if shown else f"{tool} succeeded"


@dataclass(frozen=True)
class Acts:
    """The agent's side-effecting tools and its words for them (none: every early reply is the plain apology)."""

    side_effects: frozenset[str] = frozenset()
    describe: Describe | None = None
    replies: Replies = DEFAULT  # the agent's words for an early end
    shown: Mapping[str, Sequence[str]] = field(default_factory=dict, hash=False)  # tool -> its entity-id fields

    def done(self, messages: Sequence[dict[str, Any]]) -> list[str]:
        """What the successful side effects of one turn's messages did, in the order they were called, once each."""
        results = results_of(list(messages))
        calls = []
        for message in messages:
            if message.get("role") != "assistant" or not isinstance(message.get("content"), list):
                continue
            for block in message["content"]:
                if (
                    not isinstance(block, dict)
                    or block.get("type") != "tool_use"
                    or block.get("name") not in self.side_effects
                ):
                    continue
                failed, text = results.get(block.get("id", ""), (True, ""))  # no result yet: not known to be done
                if not failed:
                    calls.append((block["name"], block.get("input") or {}, text))
        return self._said(calls)

    def recorded(self, acted: str | None) -> list[str]:
        """What the side effects the executor recorded in the turn's row did (turns.acted)."""
        return self._said((e["tool"], e.get("input") or {}, str(e.get("result", ""))) for e in sideeffects.read(acted))

    def reply(self, outcome: Outcome, text: str, done: Sequence[str]) -> str:
        """The text that ends a turn: as decided, unless the turn ends early after acting (`done`: what it did); then it
        says what was done (the model's own words, if the decision kept them, stay in front)."""
        if outcome is Outcome.END_TURN or not done:
            return text
        apology = self.replies.polite(outcome)
        kept = text[: -len(apology)].strip() if text.endswith(apology) else text.strip()
        return f"{kept}\n\n{self.replies.acted(outcome, done)}".strip()

    def ending(self, outcome: Outcome, done: Sequence[str]) -> str:
        """The text of an end from outside the loop (no model text to keep): the apology, or what was done."""
        return self.reply(outcome, self.replies.polite(outcome), done)

    def _said(self, calls: Iterable[tuple[str, dict[str, Any], str]]) -> list[str]:
        said: list[str] = []
        for tool, args, result in calls:
            if (words := self._words(tool, args, result)) not in said:
                said.append(words)
        return said

    def _words(self, tool: str, args: dict[str, Any], result: str) -> str:
        if self.describe is not None:
            try:
                if words := self.describe(tool, args, result):
                    return words
            except Exception:  # the agent's words failed: the generic ones still tell the truth
                log.exception("the agent's describe_action failed for %s; the generic words are used", tool)
        return generic(tool, args, result, self.shown.get(tool, ()))
