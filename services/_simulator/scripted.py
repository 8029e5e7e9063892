"""Scripted mode: the simulator says what a script says instead of playing a persona, so any agent's e2e runs
through the real fleet with no API key; it keeps the requests it received (docs/agent/testing.md).

A script is the model's responses in one turn, the i-th answering the turn's i-th request. One format everywhere (a
file, PUT /v1/_scripts/NAME, an eval case's `script`): schemas/script.json, checked by parse_script alone, so each
says the same words. A request past a script's end, or naming an unknown one, gets a 400 with the reason.
"""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .errors import invalid
from .personas import Reply

PREFIX = "script:"
RECEIVED_KEPT = 2000  # the last requests, for `/v1/_received`: a few hundred turns of two or more calls each
STOP_REASONS = ("end_turn", "tool_use", "max_tokens", "stop_sequence", "refusal", "pause_turn")


class ScriptError(ValueError):
    """A script that cannot be played (the message says where and why)."""


def parse_script(name: str, responses: Any) -> list[Reply]:
    """The replies of one script, checked; ScriptError names the first response that is wrong."""
    if not isinstance(responses, list) or not responses:
        raise ScriptError(f"script {name!r}: expected a non-empty list of responses")
    return [_reply(f"script {name!r} response {i + 1}", response) for i, response in enumerate(responses)]


def missing(name: str, loaded: list[str] | set[str] | dict[str, Any]) -> str:
    """The one line for a script:NAME the simulator has not loaded (the simulator's 400 and `roundtrip ask` say it)."""
    return f"no simulator script {name!r} (loaded: {', '.join(sorted(loaded)) or 'none'})"


def _reply(where: str, response: Any) -> Reply:
    if isinstance(response, str):
        response = [{"type": "text", "text": response}]
    if isinstance(response, list):
        response = {"content": response}
    if not isinstance(response, dict) or not isinstance(response.get("content"), list) or not response["content"]:
        raise ScriptError(
            f'{where}: expected a text, a list of content blocks or {{"content": [...], "stop_reason": ...}}'
        )
    stop = response.get("stop_reason")
    if stop is not None and stop not in STOP_REASONS:
        raise ScriptError(f"{where}: unknown stop_reason {stop!r} (known: {', '.join(STOP_REASONS)})")
    return Reply([_block(where, block) for block in response["content"]], stop)


def _block(where: str, block: Any) -> dict[str, Any]:
    kind = block.get("type") if isinstance(block, dict) else None
    if kind == "text" and isinstance(block.get("text"), str):
        return {"type": "text", "text": block["text"]}
    if kind == "tool_use" and isinstance(block.get("name"), str) and isinstance(block.get("input", {}), dict):
        return {"type": "tool_use", "name": block["name"], "input": block.get("input", {})}
    raise ScriptError(
        f'{where}: a block is {{"type": "text", "text": ...}} or '
        f'{{"type": "tool_use", "name": ..., "input": {{...}}}}, not {block!r}'
    )


def load_scripts(path: Path | str | None) -> dict[str, list[Reply]]:
    """The scripts of a file (name -> responses); {} for None. ScriptError when it cannot be read or played."""
    if path is None or str(path) == "":
        return {}
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ScriptError(f"simulator script {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ScriptError(f"simulator script {path}: expected an object of script name -> list of responses")
    return {name: parse_script(name, responses) for name, responses in data.items()}


def responses_so_far(body: dict[str, Any]) -> int:
    """The assistant messages since the customer's words that opened this turn (the script's position)."""
    messages = body["messages"]
    opener = max((i for i, m in enumerate(messages) if m["role"] == "user" and not _only_results(m)), default=0)
    return sum(1 for m in messages[opener + 1 :] if m["role"] == "assistant")


def _only_results(message: dict[str, Any]) -> bool:
    content = message["content"]
    return isinstance(content, list) and bool(content) and all(b.get("type") == "tool_result" for b in content)


class Scripts:
    """The scripts the simulator can play and the requests it received."""

    def __init__(self, scripts: dict[str, list[Reply]] | None = None) -> None:
        self.scripts = dict(scripts or {})
        self.received: deque[dict[str, Any]] = deque(maxlen=RECEIVED_KEPT)
        self.count = 0  # requests received so far: each one's number, so a reader asks only for what came after

    def record(self, persona: str, body: dict[str, Any]) -> None:
        self.count += 1
        self.received.append({"n": self.count, "persona": persona, "body": body})

    def reply_for(self, persona: str, body: dict[str, Any]) -> Reply | None:
        """The scripted reply of this request, None when its persona names no script (ApiError 400 when the script
        is unknown or played to its end)."""
        if not persona.startswith(PREFIX):
            return None
        name = persona[len(PREFIX) :]
        if name not in self.scripts:
            raise invalid(f"x-roundtrip-persona: {missing(name, self.scripts)}")
        script, position = self.scripts[name], responses_so_far(body)
        if position >= len(script):
            raise invalid(
                f"simulator script {name!r} has {len(script)} responses; this request asks for response {position + 1}"
            )
        return script[position]

    async def put(self, request: Request) -> Response:
        name = request.path_params["name"]
        try:
            self.scripts[name] = parse_script(name, json.loads(await request.body()))
        except (ValueError, ScriptError) as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        return JSONResponse({"script": name, "responses": len(self.scripts[name])})

    async def names(self, request: Request) -> Response:
        return JSONResponse({"scripts": sorted(self.scripts)})

    async def list_received(self, request: Request) -> Response:
        """The requests kept, oldest first; `?persona=P`: of that persona; `?after=N`: numbered after N."""
        wanted = request.query_params.get("persona")
        try:
            after = int(request.query_params.get("after", "0"))
        except ValueError:
            return JSONResponse({"error": "after: a request's number (an integer)"}, status_code=400)
        kept = [r for r in self.received if r["n"] > after and (wanted is None or r["persona"] == wanted)]
        return JSONResponse({"requests": kept})
