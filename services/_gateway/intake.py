"""What the gateway tolerates and what it refuses at the door of support.requests.

Unknown fields are ignored (a producer may add them first), each name logged once. A refused request (the schema
rejects it, its record is not keyed by its conversation id, or its id is reused with other content) gets an
`invalid_request` reply when the record names a request id and a conversation id; else it is only dead-lettered. The
reuse check remembers only this replica's requests: after a rebalance a reused id is taken for a duplicate. A refusal's
reply goes out at least once: the record read again after a crash may be answered again.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import ValidationError

from roundtrip._kernel.clock import SYSTEM
from roundtrip._kernel.kafka.dedupe import SeenIds
from roundtrip._kernel.observability import metrics
from roundtrip._kernel.observability.telemetry import current_trace_id
from roundtrip._kernel.wire.events import Outcome, SupportReply, SupportRequest, Usage

log = logging.getLogger("roundtrip.gateway")

REMEMBERED = 100_000
LOGGED_NAMES = 1000  # unknown field names logged; past these, new ones are counted only
REFUSAL_TEXT = "I'm sorry, I couldn't take this request: it was incomplete or invalid. Please try again."


class InvalidRequest(Exception):
    """A request the gateway refuses: `kind` labels the metric, the message is the reply's reason; its dead letter's
    reason starts with `reason_head` (what the console counts letters by)."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        heads = {"key": "request not keyed by its conversation", "reused": "request id reused"}
        self.reason_head = heads.get(kind, f"invalid request ({kind})")


class UnknownFields:
    """Ignores the unknown fields of requests: logs each name once, counts every one."""

    def __init__(self) -> None:
        self._logged: set[str] = set()

    def note(self, request: SupportRequest) -> None:
        for name in request.model_extra or {}:
            metrics.ignored_fields.labels("SupportRequest").inc()
            if name not in self._logged and len(self._logged) < LOGGED_NAMES:
                self._logged.add(name)
                log.warning(
                    "support requests carry a field %r the fleet does not know: ignored (logged once)", name[:100]
                )


def check_key(request: SupportRequest, key: bytes | None) -> None:
    if key != request.conversation_id.encode():
        shown = "no key" if key is None else f"key {key[:100].decode('utf-8', 'replace')!r}"
        raise InvalidRequest(
            "key",
            f"the record has {shown}: a request must be keyed by its conversation id "
            f"{request.conversation_id!r}, so its conversation stays in order",
        )


def content_digest(request: SupportRequest) -> bytes:
    """What a request asks, its ids aside: a redelivery has the same, a reused request id other content."""
    content = request.model_dump(mode="json", exclude={"request_id", "conversation_id", *(request.model_extra or {})})
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).digest()[:16]


class SeenRequests:
    """The content of each request (by turn id) this replica saw: a duplicate, or a request id reused otherwise."""

    def __init__(self, memory_s: float) -> None:
        self._digests = SeenIds(SYSTEM, REMEMBERED, max_age_s=memory_s)

    def add(self, turn_id: str, request: SupportRequest) -> bool:
        """True: a new request. False: a copy of one seen. InvalidRequest: its id was used with other content."""
        digest = content_digest(request)
        seen = self._digests.first(turn_id, digest)
        if seen is None:
            return True
        if seen != digest:
            raise InvalidRequest(
                "reused",
                f"request id {request.request_id!r} was used before in conversation "
                f"{request.conversation_id!r} with other content; use a new request id",
            )
        return False


def addressed(value: bytes | None) -> dict[str, Any] | None:
    """The request id, conversation id and customer id a record names, if it names the first two (else None)."""
    try:
        data = json.loads(value or b"")
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    ids: dict[str, Any] = {k: data.get(k) for k in ("request_id", "conversation_id", "customer_id")}
    if not all(isinstance(ids[k], str) and 0 < len(ids[k]) <= 200 for k in ("request_id", "conversation_id")):
        return None
    if not (isinstance(ids["customer_id"], str) and len(ids["customer_id"]) <= 200):
        ids["customer_id"] = ""
    return ids


def metadata_of(value: bytes | None) -> dict[str, Any] | None:
    """The record's metadata when it is valid as such (it comes back as it came), even if the rest is not."""
    try:
        given = json.loads(value or b"")
    except (ValueError, RecursionError):
        return None
    if not isinstance(given, dict) or given.get("metadata") is None:
        return None
    probe = {"request_id": "r", "conversation_id": "c", "customer_id": "c", "text": "t", "metadata": given["metadata"]}
    try:
        return SupportRequest.model_validate(probe).metadata
    except ValidationError:
        return None


def refusal(ids: dict[str, Any], reason: str, metadata: dict[str, Any] | None = None) -> SupportReply:
    return SupportReply(
        request_id=ids["request_id"],
        conversation_id=ids["conversation_id"],
        customer_id=ids["customer_id"],
        turn_id="",
        text=REFUSAL_TEXT,
        outcome=Outcome.INVALID_REQUEST,
        steps=0,
        usage=Usage(),
        cost_usd=0.0,
        trace_id=current_trace_id(),
        reason=reason,
        metadata=metadata,
    )


def refuser(
    reply: Callable[[SupportReply, str], Awaitable[None]],
) -> Callable[[Any, BaseException, str], Awaitable[None]]:
    """The requests subscription's failure hook: answer a refused request that can be addressed, with the reason."""

    async def on_failure(record: Any, exc: BaseException, reason: str) -> None:
        if not isinstance(exc, (ValidationError, InvalidRequest)):
            return  # the fleet's own failure, not the request's: dead-lettered, and the request is not refused
        ids = addressed(record.value)
        if ids is None:
            return
        shown = str(exc) if isinstance(exc, InvalidRequest) else reason
        metrics.refused_requests.labels(exc.kind if isinstance(exc, InvalidRequest) else "schema").inc()
        log.warning(
            "request %r of conversation %r refused: %s", ids["request_id"][:200], ids["conversation_id"][:200], shown
        )
        await reply(refusal(ids, shown, metadata_of(record.value)), ids["conversation_id"])

    return on_failure
