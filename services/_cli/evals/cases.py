"""The cases of an evaluation suite: one JSON file a case, read and checked before anything is asked.

A case is a conversation of one customer, one turn a message, each with what must be true of its turn; a turn's
`script` is in the simulator's script format (schemas/script.json; a plain string is a text response). The format is in
docs/agent/testing.md ("Evaluations through the fleet").
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from roundtrip._cli.asking import unknown_persona
from roundtrip._kernel.wire.events import Outcome, SupportRequest
from roundtrip._simulator.scripted import ScriptError, parse_script

EXPECTATIONS = (
    "outcome",
    "tools_called",
    "tools_not_called",
    "refused",
    "held",
    "max_steps",
    "max_cost_usd",
    "reply_contains",
    "reply_not_contains",
)
TURN_KEYS = ("message", "script", "persona", "decide", "expect")
CASE_KEYS = ("name", "description", "customer", "turns", "runs", "min_pass_rate", "needs", *TURN_KEYS)


# what a request may carry: a longer message or customer id would be refused as the request is made
MESSAGE_MAX = next(m.max_length for m in SupportRequest.model_fields["text"].metadata if hasattr(m, "max_length"))
ID_MAX = next(m.max_length for m in SupportRequest.model_fields["customer_id"].metadata if hasattr(m, "max_length"))


class CaseError(ValueError):
    """A case that cannot be run: the message names its file and what is wrong."""


@dataclass(frozen=True)
class Expect:
    outcome: tuple[str, ...] = ()
    tools_called: tuple[str, ...] = ()
    tools_not_called: tuple[str, ...] = ()
    refused: tuple[tuple[str, str], ...] | None = None  # (tool, words of the gate's error); None: not checked
    held: tuple[tuple[str, str], ...] | None = None
    max_steps: int | None = None
    max_cost_usd: float | None = None
    reply_contains: tuple[str, ...] = ()
    reply_not_contains: tuple[str, ...] = ()


@dataclass(frozen=True)
class Turn:
    message: str
    expect: Expect = field(default_factory=Expect)
    script: list[Any] | None = None  # the simulator's script format
    persona: str | None = None
    decide: str = "deny"


@dataclass(frozen=True)
class Case:
    name: str
    path: Path
    customer: str
    turns: tuple[Turn, ...]
    runs: int = 1
    min_pass_rate: float = 1.0
    needs: tuple[str, ...] = ()
    description: str = ""


def _strings(where: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CaseError(f"{where}: expected a string or a list of strings")
    return tuple(value)


def _calls(where: str, value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, list):
        raise CaseError(f'{where}: expected a list of {{"tool": ..., "because": ...}}')
    calls = []
    for item in value:
        if isinstance(item, str):
            item = {"tool": item}
        if not isinstance(item, dict) or not isinstance(item.get("tool"), str) or set(item) - {"tool", "because"}:
            raise CaseError(f'{where}: expected {{"tool": NAME, "because": WORDS}}, not {item!r}')
        calls.append((item["tool"], str(item.get("because", ""))))
    return tuple(calls)


def _number(where: str, value: Any, kind: type) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise CaseError(f"{where}: expected a number")
    return kind(value)


def parse_expect(where: str, raw: Any) -> Expect:
    if raw is None:
        return Expect()
    if not isinstance(raw, dict):
        raise CaseError(f"{where}: expected an object of expectations")
    if unknown := sorted(set(raw) - set(EXPECTATIONS)):
        raise CaseError(f"{where}: unknown expectation {unknown[0]!r} (known: {', '.join(EXPECTATIONS)})")
    outcomes = _strings(f"{where}.outcome", raw.get("outcome", []))
    known = {o.value for o in Outcome}
    if wrong := [o for o in outcomes if o not in known]:
        raise CaseError(f"{where}.outcome: unknown outcome {wrong[0]!r} (known: {', '.join(sorted(known))})")
    return Expect(
        outcome=outcomes,
        tools_called=_strings(f"{where}.tools_called", raw.get("tools_called", [])),
        tools_not_called=_strings(f"{where}.tools_not_called", raw.get("tools_not_called", [])),
        refused=_calls(f"{where}.refused", raw["refused"]) if "refused" in raw else None,
        held=_calls(f"{where}.held", raw["held"]) if "held" in raw else None,
        max_steps=_number(f"{where}.max_steps", raw["max_steps"], int) if "max_steps" in raw else None,
        max_cost_usd=_number(f"{where}.max_cost_usd", raw["max_cost_usd"], float) if "max_cost_usd" in raw else None,
        reply_contains=_strings(f"{where}.reply_contains", raw.get("reply_contains", [])),
        reply_not_contains=_strings(f"{where}.reply_not_contains", raw.get("reply_not_contains", [])),
    )


def _script(where: str, raw: Any) -> list[Any] | None:
    if raw is None:
        return None
    try:
        parse_script(where, raw)  # the simulator's own check: the same words as its PUT and its script file
    except ScriptError as exc:
        raise CaseError(str(exc).replace(f"script {where!r}", where, 1)) from None
    return list(raw)


def parse_turn(where: str, raw: Any) -> Turn:
    if not isinstance(raw, dict):
        raise CaseError(f"{where}: expected an object with a message")
    if unknown := sorted(set(raw) - set(TURN_KEYS)):
        raise CaseError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(TURN_KEYS)})")
    message = raw.get("message")
    if not isinstance(message, str) or not message.strip() or len(message) > MESSAGE_MAX:
        raise CaseError(f"{where}.message: expected what the customer writes (at most {MESSAGE_MAX} characters)")
    decide = raw.get("decide", "deny")
    if decide not in ("approve", "deny"):
        raise CaseError(f"{where}.decide: expected approve or deny, not {decide!r}")
    persona = raw.get("persona")
    if persona is not None and not isinstance(persona, str):
        raise CaseError(f"{where}.persona: expected a persona's name")
    if persona is not None and (why := unknown_persona(persona)):
        raise CaseError(f"{where}.persona: {why}")
    if persona is not None and "script" in raw:
        raise CaseError(f"{where}: a turn has a script or a persona, not both")
    return Turn(
        message,
        parse_expect(f"{where}.expect", raw.get("expect")),
        _script(f"{where}.script", raw.get("script")),
        persona,
        decide,
    )


def parse_case(path: Path, raw: Any) -> Case:
    where = str(path)
    if not isinstance(raw, dict):
        raise CaseError(f"{where}: expected a JSON object (a case)")
    if unknown := sorted(set(raw) - set(CASE_KEYS)):
        raise CaseError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(CASE_KEYS)})")
    customer = raw.get("customer")
    if not isinstance(customer, str) or not customer or len(customer) > ID_MAX:
        raise CaseError(f"{where}: customer: expected the customer id the conversation is asked as")
    if "turns" in raw:
        if set(raw) & set(TURN_KEYS):
            raise CaseError(f"{where}: either turns or message (one turn), not both")
        if not isinstance(raw["turns"], list) or not raw["turns"]:
            raise CaseError(f"{where}: turns: expected a non-empty list")
        turns = tuple(parse_turn(f"{where}: turns[{i}]", t) for i, t in enumerate(raw["turns"]))
    else:
        turns = (parse_turn(where, {k: raw[k] for k in TURN_KEYS if k in raw}),)
    runs = _number(f"{where}: runs", raw.get("runs", 1), int)
    rate = _number(f"{where}: min_pass_rate", raw.get("min_pass_rate", 1.0), float)
    if runs < 1 or not 0 < rate <= 1:
        raise CaseError(f"{where}: runs must be at least 1 and min_pass_rate in (0, 1]")
    name = raw.get("name", path.stem)
    if not isinstance(name, str) or not name:
        raise CaseError(f"{where}: name: expected a string")
    return Case(
        name,
        path,
        customer,
        turns,
        runs,
        rate,
        _strings(f"{where}: needs", raw.get("needs", [])),
        str(raw.get("description", "")),
    )


def load_case(path: Path) -> Case:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CaseError(f"{path}: {exc}") from None
    return parse_case(path, raw)


def load_suite(paths: Iterable[Path]) -> list[Case]:
    """The cases of each path (a case file, or a folder of them: its *.json, by name); CaseError on the first wrong
    one, and on two cases of one name."""
    cases: list[Case] = []
    for path in paths:
        if path.is_dir():
            files = sorted(path.glob("*.json"))
            if not files:
                raise CaseError(f"{path}: no case files (*.json) in this folder")
        elif path.exists():
            files = [path]
        else:
            raise CaseError(f"{path}: no such file or folder")
        cases += [load_case(f) for f in files]
    seen: dict[str, Path] = {}
    for case in cases:
        if case.name in seen:
            raise CaseError(f"{case.path}: case {case.name!r} is also {seen[case.name]}")
        seen[case.name] = case.path
    return cases


def case_json(case: dict[str, Any]) -> str:
    """A case as its file says it (two-space indent, a newline at the end)."""
    return json.dumps(case, indent=2, ensure_ascii=False) + "\n"
