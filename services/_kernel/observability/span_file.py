"""The span file: one JSON object per finished span, appended by every process of a fleet (O_APPEND), rotated under
an flock; what `roundtrip trace` and the console read when no Jaeger is configured."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pydantic_core
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


def _encode_span(record: dict[str, Any]) -> bytes:
    return pydantic_core.to_json(record, fallback=str)


class JsonLinesSpanExporter(SpanExporter):
    """Appends one JSON object per finished span to a file (O_APPEND: safe across processes), rotated past
    `max_bytes` under an flock so two processes do not rotate twice; at most (backups + 1) x max_bytes."""

    def __init__(self, path: Path, max_bytes: int, backups: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.max_bytes, self.backups = path, max_bytes, backups
        self._fd = self._open()

    def _open(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _rotate_if_needed(self) -> None:
        mine = os.fstat(self._fd)
        try:
            current = os.stat(self.path)
        except FileNotFoundError:
            current = None
        if current is None or current.st_ino != mine.st_ino:
            os.close(self._fd)
            self._fd = self._open()
            mine = current = os.fstat(self._fd)
        if not self.max_bytes or current.st_size < self.max_bytes:
            return
        with open(f"{self.path}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            current = os.stat(self.path)
            if current.st_ino == mine.st_ino and current.st_size >= self.max_bytes:
                for n in range(self.backups - 1, 0, -1):
                    older = Path(f"{self.path}.{n}")
                    if older.exists():
                        os.replace(older, f"{self.path}.{n + 1}")
                if self.backups:
                    os.replace(self.path, f"{self.path}.1")
                else:
                    os.truncate(self.path, 0)
            os.close(self._fd)
            self._fd = self._open()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self._rotate_if_needed()
        lines = []
        for span in spans:
            ctx = span.get_span_context()
            assert ctx is not None
            status = span.status
            lines.append(
                _encode_span(
                    {
                        "trace_id": format(ctx.trace_id, "032x"),
                        "span_id": format(ctx.span_id, "016x"),
                        "parent_id": format(span.parent.span_id, "016x") if span.parent else None,
                        "name": span.name,
                        "service": span.resource.attributes.get("service.name"),
                        "kind": span.kind.name,
                        "start_ns": span.start_time,
                        "end_ns": span.end_time,
                        "status": status.status_code.name,
                        "status_message": status.description,
                        "attributes": dict(span.attributes) if span.attributes else {},
                        "events": [{"name": e.name, "attributes": dict(e.attributes or {})} for e in span.events]
                        if span.events
                        else [],
                        "links": [format(link.context.span_id, "016x") for link in span.links] if span.links else [],
                    }
                )
            )
        if lines:
            os.write(self._fd, b"\n".join(lines) + b"\n")
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        os.close(self._fd)


def span_files(path: Path, backups: int) -> list[Path]:
    return [p for p in (*(Path(f"{path}.{n}") for n in range(backups, 0, -1)), path) if p.exists()]
