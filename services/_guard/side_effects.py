"""What a turn did: the side effects that succeeded, for the reply that ends it early.

A side effect is a successful call of a tool the agent declares serial. A turn ended early after one says what was
done instead of an apology that would have the customer ask for it again. The generic words name only the entity ids
the tool shows (its x-entity fields), never the rest of its input, which may carry internal keys (an idempotency key).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from roundtrip._guard.replies import Replies
from roundtrip._guard.rules import results_of
from roundtrip._kernel.storage import sideeffects
from roundtrip._kernel.wire.events import Outcome

log = logging.getLogger("roundtrip.guard")

Describe = Callable[[str, dict[str, Any], str], "str | None"]  # (tool, input, result text) -> what the customer reads


def generic(tool: str, args: dict[str, Any], result: str, fields: Sequence[str]) -> str:
    shown = ", ".join(f"{key}={str(args[key])[:60]}" for key in fields if key in args)
    return f"{tool} succeeded ({shown})" if shown else f"{tool} succeeded"


@dataclass(frozen=True)
class SideEffects:
    """The agent's side-effecting tools and its words for them (none: every early reply is the plain apology)."""

    side_effects: frozenset[str]
    describe: Describe | None
    replies: Replies
    shown: Mapping[str, Sequence[str]] = field(default_factory=dict, hash=False)  # tool -> its entity-id fields

    def done(self, messages: Sequence[dict[str, Any]]) -> list[str]:
        """What the successful side effects of one turn's messages did, in call order, once each."""
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
        """What the side effects the executor recorded in the turn's row did (an end from outside has no transcript)."""
        return self._said((e["tool"], e.get("input") or {}, str(e.get("result", ""))) for e in sideeffects.read(acted))

    def reply(self, outcome: Outcome, text: str, done: Sequence[str]) -> str:
        """The text that ends a turn: as decided, unless it ends early after acting; then it says what was done."""
        if outcome is Outcome.END_TURN or not done:
            return text
        apology = self.replies.polite(outcome)
        kept = text[: -len(apology)].strip() if text.endswith(apology) else text.strip()
        return f"{kept}\n\n{self.replies.acted(outcome, done)}".strip()

    def ending(self, outcome: Outcome, done: Sequence[str]) -> str:
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
