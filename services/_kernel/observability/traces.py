"""A turn's spans read back, for `roundtrip trace` and the console: from Jaeger's query API when one is configured,
else from the span files the services write."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

import httpx

from roundtrip._kernel.observability.span_file import span_files


class TraceUnreadable(Exception):
    """Where the spans should be cannot be read: `str(exc)` says where and why, in one line."""


class SpanSources(Protocol):
    """The settings that say where spans are read: Jaeger's query API, else the span files in effect."""

    span_file_backups: int

    @property
    def effective_jaeger_query_url(self) -> str | None: ...

    @property
    def effective_span_file(self) -> Path | None: ...


def read(settings: SpanSources, wanted: str) -> tuple[str, list[dict[str, Any]]]:
    """(trace id, its spans) for a turn id or a trace id; no spans when none is found."""
    url = settings.effective_jaeger_query_url
    if url:
        try:
            return from_jaeger(url, wanted)
        except httpx.HTTPError as exc:
            raise TraceUnreadable(f"cannot read Jaeger at {url} ({exc})") from None
    path = settings.effective_span_file
    files = span_files(path, settings.span_file_backups) if path is not None else []
    if not files:
        raise TraceUnreadable(f"no span file at {path}")
    return from_files(files, wanted)


def from_files(files: list[Path], wanted: str) -> tuple[str, list[dict[str, Any]]]:
    """Parse only the lines that name `wanted`: the files hold every turn's spans, and a page polls one turn's."""
    lines = [line for path in files for line in _lines(path)]
    spans = [json.loads(line) for line in lines if wanted in line]
    if any(s["trace_id"] == wanted for s in spans):
        return wanted, [s for s in spans if s["trace_id"] == wanted]
    trace_id = next((s["trace_id"] for s in spans if s["attributes"].get("roundtrip.turn_id") == wanted), "")
    if not trace_id:
        return wanted, []
    # the turn's trace holds spans that do not name the turn (an MCP server's, for one)
    return trace_id, [s for line in lines if trace_id in line for s in [json.loads(line)] if s["trace_id"] == trace_id]


def _lines(path: Path) -> list[str]:
    try:
        return [line for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    except FileNotFoundError:  # rotated away between the listing and the read
        return []


def from_jaeger(url: str, wanted: str) -> tuple[str, list[dict[str, Any]]]:
    """GET /api/traces/<id>, or search the turn spans by tag roundtrip.turn_id."""
    data: list[dict[str, Any]] = []
    if len(wanted) == 32 and all(c in "0123456789abcdef" for c in wanted.lower()):
        response = httpx.get(f"{url}/api/traces/{wanted.lower()}", timeout=10)
        if response.status_code != 404:
            response.raise_for_status()
            data = response.json().get("data") or []
    if not data:
        response = httpx.get(
            f"{url}/api/traces",
            timeout=10,
            params={
                "service": "roundtrip-gateway",
                "tags": json.dumps({"roundtrip.turn_id": wanted}),
                "limit": 5,
                "lookback": "7d",
            },
        )
        response.raise_for_status()
        data = response.json().get("data") or []
    if not data:
        return wanted, []
    found = data[0]
    return found["traceID"], [jaeger_span(span, found.get("processes", {})) for span in found["spans"]]


def jaeger_span(span: dict[str, Any], processes: dict[Any, Any]) -> dict[str, Any]:
    """A span of Jaeger's JSON API in the shape of the span file's records."""
    tags = {t["key"]: t["value"] for t in span.get("tags", [])}
    parent = next((r["spanID"] for r in span.get("references", []) if r.get("refType") == "CHILD_OF"), None)
    error = tags.get("error") in (True, "true") or tags.get("otel.status_code") == "ERROR"
    return {
        "trace_id": span["traceID"],
        "span_id": span["spanID"],
        "parent_id": parent,
        "name": span["operationName"],
        "service": processes.get(span.get("processID"), {}).get("serviceName", "?"),
        "kind": str(tags.get("span.kind", "")).upper(),
        "start_ns": span["startTime"] * 1000,
        "end_ns": (span["startTime"] + span["duration"]) * 1000,
        "status": "ERROR" if error else "UNSET",
        "status_message": tags.get("otel.status_description"),
        "attributes": tags,
        "links": [r["spanID"] for r in span.get("references", []) if r.get("refType") == "FOLLOWS_FROM"],
    }
