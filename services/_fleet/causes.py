"""Why a child of the fleet exited, in one line read from its own log: what `roundtrip up` says when a part keeps
failing at start. The cause is the first of: a port it could not bind, the one-line refusal `roundtrip run` prints
for bad configuration, the last exception of a traceback that is not the exit itself, the last error a logger said,
the last line."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

MAX_CHARS = 300  # a cause longer than this is cut: the log has the rest

_BIND = re.compile(r"\[errno 98\]|address already in use|eaddrinuse", re.IGNORECASE)
# ('127.0.0.1', 8000) as asyncio and uvicorn say it, or host:8000 / port 8000 as our own messages do
_PORT = (
    re.compile(r"\('[^']*',\s*(\d+)"),
    re.compile(r"\[?[\w.:-]*\]?:(\d{2,5})\b"),
    re.compile(r"\bport\s+(\d{2,5})\b", re.IGNORECASE),
)
_REFUSAL = re.compile(r"^error:\s*(.+)$", re.IGNORECASE)
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning|Timeout)\w*)(?::\s*(.*))?$")
_EXIT = ("SystemExit", "KeyboardInterrupt", "click.exceptions.Exit", "typer.Exit")
_LOGGED_ERROR = re.compile(r"\b(ERROR|CRITICAL|FATAL)\b:?\s*(.*)")
_FRAME = re.compile(r"^\s+(File \"|\^|~)|^\s{4}")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class Cause:
    """Why a part exited: `text`, one line; `port`, when it could not bind one; `refused`, when it is the one-line
    refusal of its configuration (the same settings are refused again: not worth a restart)."""

    text: str
    port: int | None = None
    refused: bool = False


def of_log(text: str) -> Cause:
    """The cause of an exit, from the part's log of that run."""
    lines = [_ANSI.sub("", line).rstrip() for line in text.splitlines()]
    lines = [line for line in lines if line.strip()]
    for line in lines:
        if _BIND.search(line):
            port = _port(line)
            return Cause(f"port {port} is taken" if port else _short(line), port)
    for line in reversed(lines):
        if match := _REFUSAL.match(line):
            return Cause(_short(match.group(1)), refused=True)
    exceptions = [(i, m) for i, line in enumerate(lines) if (m := _EXCEPTION.match(line))]
    for _, match in reversed(exceptions):
        if match.group(1) not in _EXIT:
            return Cause(_short(f"{match.group(1)}: {match.group(2)}" if match.group(2) else match.group(1)))
    for line in reversed(lines):
        if (match := _LOGGED_ERROR.search(line)) and match.group(2):
            return Cause(_short(match.group(2)))
    plain = [line for line in lines if not _FRAME.match(line) and not line.startswith("Traceback (")]
    if plain:
        return Cause(_short(plain[-1]))
    return Cause("its log says nothing")


def of_run(log_path: Path, start: int) -> Cause:
    """The cause from what the part wrote to `log_path` from byte `start` on (its log is appended to by each run)."""
    try:
        with open(log_path, "rb") as log:
            log.seek(start)
            return of_log(log.read().decode(errors="replace"))
    except OSError:
        return Cause("its log cannot be read")


def _port(line: str) -> int | None:
    for pattern in _PORT:
        for match in pattern.finditer(line):
            port = int(match.group(1))
            if 0 < port < 65536:
                return port
    return None


def _short(line: str) -> str:
    line = " ".join(line.split())
    return line if len(line) <= MAX_CHARS else line[: MAX_CHARS - 3] + "..."
