"""No default in the services' cores exists only for tests (docs/decisions/service-shell.md): every defaulted parameter
of the five services, roundtrip.testing and the shell is passed explicitly by some call in services/ (a production
caller that wants another value), or it is listed below with why it stays. A caller is found by the callee's name (a
class's for `__init__`) and the parameter's keyword or position; a call with `*args`/`**kwargs` counts as passing it.

The rooms not walked yet (`_cli`, `_console`, the rest of `_kernel`, `_broker`, `_simulator`, `_shop`, `_fleet`,
`_sdk`) are outside this check for now."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from tests.syntax import parse

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ROOT / "services"
WALKED = ("_guard", "_model", "_gate", "_executor", "_gateway", "testing", "_kernel/shell.py")

PUBLIC = "the public API (roundtrip.testing): an agent author's test passes it"
CLOCK = "a clock only tests set; still to become the core's clock port"
BOUND = "a memory bound only tests lower, to see what happens at it"
ALLOWED = {
    "services/testing/__init__.py:reply:stop_reason": PUBLIC,
    "services/testing/__init__.py:run_turn:deps": PUBLIC,
    "services/testing/__init__.py:run_turn:state_dir": PUBLIC,
    "services/testing/__init__.py:run_turn:approve": PUBLIC,
    "services/testing/__init__.py:run_turn:persona": PUBLIC,
    "services/_model/capacity.py:Capacity:slow_start": "off in a plain loop around the SDK (the baseline)",
    "services/_model/capacity.py:Capacity:clock": CLOCK,
    "services/_model/capacity.py:Capacity:rng": "the jitter's random source; a test seeds it",
    "services/_gate/authorization.py:OwnershipCache:clock": CLOCK,
    "services/_guard/conversations.py:open_turn:now": CLOCK,
    "services/_guard/conversations.py:close_turn_with_reply:now": CLOCK,
    "services/_guard/ledger.py:await_approval:now": CLOCK,
    "services/_guard/ledger.py:advance:now": CLOCK,
    "services/_guard/sweeper.py:sweep:now": CLOCK,
    "services/_gate/authorization.py:OwnershipCache:max_entries": BOUND,
    "services/_gate/recorded.py:RecordedTurns:remembered": BOUND,
    "services/_gateway/intake.py:SeenRequests:capacity": BOUND,
    "services/_guard/loop.py:StepClock:limit": BOUND,
    "services/_guard/retention.py:Retention:batch": "rows per delete; a test makes several batches of a few rows",
    "services/_guard/retention.py:Retention:max_batches": "deletes per sweep; a test stops early",
    "services/_guard/approvals.py:_shown:limit": "how many ids a log line shows",
    "services/_guard/ledger.py:outbox:limit": "rows per republish; the console reads fewer",
    "services/_guard/outbox.py:republish_all:timeout": "the start-up republish's bound; a test waits less",
    "services/_guard/outbox.py:Bounded:timeout": "the same bound, per row",
}


def _calls_and_defaults() -> tuple[dict[str, list[tuple[set[str], int, bool]]], list[tuple[str, str, str, int | None]]]:
    calls: dict[str, list[tuple[set[str], int, bool]]] = defaultdict(list)
    defaulted: list[tuple[str, str, str, int | None]] = []
    for path in sorted(SERVICES.rglob("*.py")):
        relative = str(path.relative_to(ROOT))
        walked = any(relative.startswith(f"services/{room}") for room in WALKED)
        tree = parse(path.read_text(), relative)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
                spread = any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords)
                calls[name].append(({k.arg for k in node.keywords if k.arg}, len(node.args), spread))
            if walked and isinstance(node, ast.ClassDef | ast.Module):
                for child in node.body:
                    if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                        defaulted += _defaulted(relative, child, node)
    return calls, defaulted


def _defaulted(
    relative: str, function: ast.FunctionDef | ast.AsyncFunctionDef, owner: ast.ClassDef | ast.Module
) -> list[tuple[str, str, str, int | None]]:
    method = isinstance(owner, ast.ClassDef)
    name = owner.name if isinstance(owner, ast.ClassDef) and function.name == "__init__" else function.name
    static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in function.decorator_list)
    shift = 1 if method and not static else 0
    args = function.args
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    pairs = enumerate(zip(positional, defaults, strict=True))
    found = [(relative, name, a.arg, i - shift) for i, (a, d) in pairs if d is not None]
    found += [(relative, name, a.arg, None) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d]
    return found


def test_every_default_has_a_production_caller_that_passes_it_or_says_why_it_stays():
    calls, defaulted = _calls_and_defaults()
    uncalled = []
    for relative, name, parameter, index in defaulted:
        passed = any(
            parameter in keywords or spread or (index is not None and positional > index)
            for keywords, positional, spread in calls.get(name, [])
        )
        if not passed:
            uncalled.append(f"{relative}:{name}:{parameter}")
    assert not (unlisted := sorted(set(uncalled) - set(ALLOWED))), (
        "defaults no production call passes (make them required, or list them in ALLOWED with why they stay):\n  "
        + "\n  ".join(unlisted)
    )
    assert not (stale := sorted(set(ALLOWED) - set(uncalled))), f"ALLOWED lists defaults a caller passes now: {stale}"
