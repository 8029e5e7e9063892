"""The agent's words the fleet fills in: the gate's refusals (what the model reads) and the texts of an early end
after a side effect (what the customer reads), with their defaults and the fields each may name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from roundtrip._kernel.wire.events import Outcome

# What the gate tells the model when it refuses a call (an agent may word each its own way: `Agent.messages`).
# `not_found_listed` is said only when the agent has a tool `list_<kind>s`: the text names no tool the agent lacks.
GATE_MESSAGES = {
    "lookup_failed": "A system this call needs could not be reached to verify it; nothing was done. Try again shortly.",
    "internal_error": "This call could not be checked (an internal error in the gate); nothing was done. Try again.",
    "unknown_tool": "Unknown tool {tool}. Available tools: {tools}.",
    "unknown_tool_close": "Unknown tool {tool}. Did you mean {close}? Available tools: {tools}.",
    "invalid_input": "Invalid input for {tool}: {problems}. Fix these fields and call again.",
    "no_principal": "This request has no signed-in customer, so no tool may act on an account.",
    "not_an_id": "`{field}` must be a {kind} id (a string).",
    "not_found": (
        "{Kind} {id} was not found among this customer's {kind}s. Do not guess ids: use only an id the customer gave "
        "or a tool result showed."
    ),
    "not_found_listed": (
        "{Kind} {id} was not found among this customer's {kind}s. Do not guess ids: use {list_tool} to see the "
        "customer's {kind}s and their ids."
    ),
    "not_allowed": "Not allowed: {reason}",
    "decision_refused": "Not run: {problem}. Nothing was done.",
    "approval_pending": (
        "Not run: this call needs a person's approval and another call of this step ({held}) is already waiting for "
        "one. Make this call again, on its own, once that one is decided."
    ),
}
GATE_FIELDS = {
    "unknown_tool": ("tool", "tools"),
    "unknown_tool_close": ("tool", "close", "tools"),
    "invalid_input": ("tool", "problems"),
    "not_an_id": ("field", "kind"),
    "not_found": ("Kind", "kind", "id"),
    "not_found_listed": ("Kind", "kind", "id", "list_tool"),
    "not_allowed": ("reason",),
    "decision_refused": ("problem",),
    "approval_pending": ("held",),
}


def gate_message(key: str, texts: Mapping[str, str] | None = None, **fields: Any) -> str:
    """The gate's text for `key`, the agent's (`texts`) where it has one, with its fields filled."""
    template = (texts or {}).get(key) or GATE_MESSAGES[key]
    return template.format(**fields) if fields else template


ACTED_DEFAULT = "default"  # the key of Agent.acted_replies for every outcome it does not name
ACTED_FIELDS = ("done",)


def template_problems(where: str, text: Any, fields: Sequence[str]) -> list[str]:
    """An agent's text the fleet fills: a string naming only the fields it is given (in braces)."""
    if not isinstance(text, str) or not text.strip():
        return [f"{where} must be a non-empty string"]
    try:
        text.format(**{name: "x" for name in fields})
    except (KeyError, IndexError, ValueError) as exc:
        named = ", ".join("{" + f + "}" for f in fields) or "no field (write a literal brace as {{ or }})"
        return [f"{where} cannot be filled ({type(exc).__name__}: {exc}); it may name {named}"]
    return []


def text_problems(agent: Any) -> list[str]:
    """What is wrong with the texts of an agent: a key it does not know, a template that cannot be filled."""
    problems, outcomes = [], {o.value for o in Outcome}
    if stray := sorted(set(agent.replies) - outcomes):
        problems.append(f"replies for unknown outcomes {stray} (known: {sorted(outcomes)})")
    if stray := sorted(set(agent.messages) - set(GATE_MESSAGES)):
        problems.append(f"messages for unknown keys {stray} (known: {sorted(GATE_MESSAGES)})")
    if stray := sorted(set(agent.acted_replies) - outcomes - {ACTED_DEFAULT}):
        problems.append(f"acted_replies for unknown outcomes {stray} (known: {ACTED_DEFAULT!r} and the outcomes)")
    for key, text in agent.messages.items():
        problems += template_problems(f"messages[{key!r}]", text, GATE_FIELDS.get(key, ()))
    for key, text in agent.acted_replies.items():
        problems += template_problems(f"acted_replies[{key!r}]", text, ACTED_FIELDS)
    if stray := sorted(set(agent.progress) - set(agent.tool_parts[0]) - agent.mounted):
        problems.append(f"progress words for unknown tools {stray}")
    if stray := sorted(name for name, words in agent.progress.items() if not isinstance(words, str)):
        problems.append(f"progress words that are not text: {stray}")
    return problems
