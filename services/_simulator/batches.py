"""The Message Batches API: create, retrieve, list, cancel, delete and results as JSONL, each request answered by the
same engine as /v1/messages (persona, script, prompt cache) when its batch ends, after the app's batch delay.

As the API does, a request's params are validated when the batch is processed (a bad one is an `errored` result);
only the batch itself is checked on create. The headers that ask for `errored` or `expired` results, and the count
of creates per custom id (`GET /v1/_batches`), are listed in docs/decisions/simulator.md.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .errors import ApiError, authenticate, error_response, header_number, invalid, new_request_id

DELAY_HEADER = "x-roundtrip-batch-delay-ms"
ERRORED_HEADER = "x-roundtrip-batch-errored"
EXPIRED_HEADER = "x-roundtrip-batch-expired"
CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
MAX_REQUESTS = 100_000  # the API's limit per batch
EXPIRES_AFTER = timedelta(hours=24)

# (persona header value, params) -> the message a plain call would get; raises ApiError as that call would
Answer = Callable[[str, dict[str, Any]], dict[str, Any]]


@dataclass
class Batch:
    id: str
    requests: list[dict[str, Any]]
    persona: str
    created_at: datetime
    ends_at: float  # monotonic
    errored: set[str]
    expired: set[str]
    cancel_initiated_at: datetime | None = None
    ended_at: datetime | None = None
    results: list[dict[str, Any]] = field(default_factory=list)

    def view(self, base_url: str) -> dict[str, Any]:
        counts = dict.fromkeys(("processing", "succeeded", "errored", "canceled", "expired"), 0)
        if self.ended_at is None:
            counts["processing"] = len(self.requests)
        else:
            for result in self.results:
                counts[result["result"]["type"]] += 1
        status = "ended" if self.ended_at else "canceling" if self.cancel_initiated_at else "in_progress"
        return {
            "id": self.id,
            "type": "message_batch",
            "processing_status": status,
            "request_counts": counts,
            "created_at": _stamp(self.created_at),
            "expires_at": _stamp(self.created_at + EXPIRES_AFTER),
            "ended_at": _stamp(self.ended_at) if self.ended_at else None,
            "cancel_initiated_at": _stamp(self.cancel_initiated_at) if self.cancel_initiated_at else None,
            "archived_at": None,
            "results_url": f"{base_url}/v1/messages/batches/{self.id}/results" if self.ended_at else None,
        }


class Batches:
    """The batches the simulator holds (in memory: a restarted simulator has none, as a lost API would)."""

    def __init__(self, answer: Answer, delay_ms: float) -> None:
        self._answer, self._delay_ms, self._clock = answer, delay_ms, time.monotonic
        self._batches: dict[str, Batch] = {}
        self.submissions: dict[str, int] = {}  # custom id -> how many creates named it

    def routes(self) -> list[Route]:
        return [
            Route("/v1/messages/batches", self.create, methods=["POST"]),
            Route("/v1/messages/batches", self.list, methods=["GET"]),
            Route("/v1/messages/batches/{batch_id}", self.retrieve, methods=["GET"]),
            Route("/v1/messages/batches/{batch_id}", self.delete, methods=["DELETE"]),
            Route("/v1/messages/batches/{batch_id}/cancel", self.cancel, methods=["POST"]),
            Route("/v1/messages/batches/{batch_id}/results", self.results, methods=["GET"]),
            Route("/v1/_batches", self.counts, methods=["GET"]),
        ]

    async def create(self, request: Request) -> Response:
        try:
            authenticate(request)
            body = json.loads(await request.body())
            requests = _requests(body)
            delay_ms = header_number(request, DELAY_HEADER, self._delay_ms)
        except ValueError as exc:
            return _refused(invalid(f"There was an error parsing the body of your request: {exc}"))
        except ApiError as error:
            return _refused(error)
        for item in requests:
            self.submissions[item["custom_id"]] = self.submissions.get(item["custom_id"], 0) + 1
        batch = Batch(
            id=f"msgbatch_sim_{uuid.uuid4().hex[:24]}",
            requests=requests,
            persona=request.headers.get("x-roundtrip-persona", ""),
            created_at=datetime.now(UTC),
            ends_at=self._clock() + delay_ms / 1000,
            errored=_ids(request, ERRORED_HEADER),
            expired=_ids(request, EXPIRED_HEADER),
        )
        self._batches[batch.id] = batch
        return JSONResponse(batch.view(_base(request)))

    async def retrieve(self, request: Request) -> Response:
        try:
            batch = self._found(request)
        except ApiError as error:
            return _refused(error)
        await self._settle(batch)
        return JSONResponse(batch.view(_base(request)))

    async def list(self, request: Request) -> Response:
        try:
            authenticate(request)
            limit = int(request.query_params.get("limit", "20"))
        except ValueError:
            return _refused(invalid("limit: expected an integer"))
        except ApiError as error:
            return _refused(error)
        newest = list(reversed(self._batches.values()))
        after, before = request.query_params.get("after_id"), request.query_params.get("before_id")
        ids = [b.id for b in newest]
        if after in ids:
            newest = newest[ids.index(after) + 1 :]
        elif before in ids:
            newest = newest[: ids.index(before)]
        page = newest[: max(1, min(limit, 1000))]
        for batch in page:
            await self._settle(batch)
        data = [b.view(_base(request)) for b in page]
        return JSONResponse(
            {
                "data": data,
                "has_more": len(newest) > len(page),
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None,
            }
        )

    async def cancel(self, request: Request) -> Response:
        try:
            batch = self._found(request)
        except ApiError as error:
            return _refused(error)
        if batch.ended_at is None and batch.cancel_initiated_at is None:
            batch.cancel_initiated_at = datetime.now(UTC)
        view = batch.view(_base(request))
        await self._settle(batch)  # the next look sees it ended, its unprocessed requests canceled
        return JSONResponse(view)

    async def delete(self, request: Request) -> Response:
        try:
            batch = self._found(request)
            await self._settle(batch)
            if batch.ended_at is None:
                raise invalid(f"Batch {batch.id} cannot be deleted while it is in progress; cancel it first.")
        except ApiError as error:
            return _refused(error)
        del self._batches[batch.id]
        return JSONResponse({"id": batch.id, "type": "message_batch_deleted"})

    async def results(self, request: Request) -> Response:
        try:
            batch = self._found(request)
            await self._settle(batch)
            if batch.ended_at is None:
                raise invalid(f"Batch {batch.id} has not finished processing; its results are not available yet.")
        except ApiError as error:
            return _refused(error)
        lines = "".join(json.dumps(result) + "\n" for result in batch.results)
        return StreamingResponse(iter([lines.encode()]), media_type="application/binary")

    async def counts(self, request: Request) -> Response:
        """Not part of the API: how many creates named each custom id (a call submitted twice shows as 2)."""
        return JSONResponse(
            {
                "submissions": self.submissions,
                "batches": {b.id: b.view(_base(request))["processing_status"] for b in self._batches.values()},
            }
        )

    def _found(self, request: Request) -> Batch:
        authenticate(request)
        batch_id = request.path_params["batch_id"]
        if batch_id not in self._batches:
            raise ApiError(404, f"Message batch {batch_id!r} not found.")
        return self._batches[batch_id]

    async def _settle(self, batch: Batch) -> None:
        """End `batch` when its time has come (or it was canceled): every request answered once, in a thread when
        there are many so the event loop keeps serving."""
        if batch.ended_at is not None or (batch.cancel_initiated_at is None and self._clock() < batch.ends_at):
            return
        if batch.cancel_initiated_at is not None:
            batch.results = [{"custom_id": r["custom_id"], "result": {"type": "canceled"}} for r in batch.requests]
        else:
            batch.results = await asyncio.to_thread(lambda: [self._result(batch, r) for r in batch.requests])
        batch.ended_at = datetime.now(UTC)

    def _result(self, batch: Batch, item: dict[str, Any]) -> dict[str, Any]:
        custom_id = item["custom_id"]
        if custom_id in batch.expired:
            return {"custom_id": custom_id, "result": {"type": "expired"}}
        if custom_id in batch.errored:
            return _errored(custom_id, ApiError(500, "Internal server error (simulated batch result)."))
        try:
            return {
                "custom_id": custom_id,
                "result": {"type": "succeeded", "message": self._answer(batch.persona, item["params"])},
            }
        except ApiError as error:
            return _errored(custom_id, error)


def _requests(body: Any) -> list[dict[str, Any]]:
    if not isinstance(body, dict) or not isinstance(body.get("requests"), list) or not body["requests"]:
        raise invalid("requests: expected a non-empty list of {custom_id, params}")
    requests: list[dict[str, Any]] = body["requests"]
    if len(requests) > MAX_REQUESTS:
        raise ApiError(413, f"requests: a batch holds at most {MAX_REQUESTS} requests, got {len(requests)}")
    seen: set[str] = set()
    for i, item in enumerate(requests):
        if not isinstance(item, dict) or set(item) != {"custom_id", "params"}:
            raise invalid(f"requests.{i}: expected exactly custom_id and params")
        custom_id = item["custom_id"]
        if not isinstance(custom_id, str) or not CUSTOM_ID.match(custom_id):
            raise invalid(f"requests.{i}.custom_id: expected 1 to 64 letters, digits, '-' or '_', got {custom_id!r}")
        if custom_id in seen:
            raise invalid(f"requests.{i}.custom_id: {custom_id!r} appears more than once in this batch")
        if not isinstance(item["params"], dict):
            raise invalid(f"requests.{i}.params: expected an object")
        seen.add(custom_id)
    return requests


def _errored(custom_id: str, error: ApiError) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "result": {
            "type": "errored",
            "error": {"type": "error", "error": {"type": error.error_type, "message": error.message}},
        },
    }


def _ids(request: Request, header: str) -> set[str]:
    return {part.strip() for part in request.headers.get(header, "").split(",") if part.strip()}


def _base(request: Request) -> str:
    return str(request.base_url).rstrip("/")


def _stamp(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def _refused(error: ApiError) -> Response:
    return error_response(error, new_request_id())
