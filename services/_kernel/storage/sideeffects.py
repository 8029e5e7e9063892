"""The side effects a turn has had, kept in its row (turns.acted) for the ends decided outside the loop.

The executor appends one JSON line per call of a serial tool (one that changes something:
Agent.serial) that succeeded, right after the batch ran and before the next model call goes
out: {"id": tool_use id, "tool": name, "input": {...}, "result": its text, cut at RESULT_CHARS}.
The guard reads them back when it ends a turn from outside the loop (a cancel, the deadline, a
turn stuck, an approval nobody decided) to say what was done. A redelivered batch may append a
call again: `read` keeps each id once, in the order first recorded.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

RESULT_CHARS = 2000


def lines(calls: Iterable[Any], results: Iterable[dict[str, Any]], is_serial: Callable[[str], bool]) -> str:
    """The lines to append for these calls (objects with id, name, input) and their tool_result blocks ('' if none)."""
    by_id = {c.id: c for c in calls if is_serial(c.name)}
    out = []
    for block in results:
        call = by_id.get(block.get("tool_use_id", ""))
        if call is not None and not block.get("is_error"):
            content = block.get("content")
            text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False, default=str)
            out.append(
                json.dumps(
                    {"id": call.id, "tool": call.name, "input": call.input, "result": text[:RESULT_CHARS]},
                    ensure_ascii=False,
                    default=str,
                )
                + "\n"
            )
    return "".join(out)


def read(acted: str | None) -> list[dict[str, Any]]:
    """The recorded side effects, each tool_use id once (a line that does not parse is skipped)."""
    seen: dict[str, dict[str, Any]] = {}
    for line in (acted or "").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get("tool"), str):
            seen.setdefault(str(entry.get("id")), entry)
    return list(seen.values())
