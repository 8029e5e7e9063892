"""The side effects a turn has had, kept in its row (turns.acted) so an end decided outside the loop can say what was
done. The executor appends one JSON line per serial call that succeeded, before the next model call goes out; a
redelivered batch may append a call again.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

RESULT_CHARS = 2000


def lines(calls: Iterable[Any], results: Iterable[dict[str, Any]], is_serial: Callable[[str], bool]) -> str:
    """The lines to append for the serial calls among `calls` that succeeded ('' if none)."""
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
    """The recorded side effects, each tool_use id once, in the order first recorded."""
    seen: dict[str, dict[str, Any]] = {}
    for line in (acted or "").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get("tool"), str):
            seen.setdefault(str(entry.get("id")), entry)
    return list(seen.values())
