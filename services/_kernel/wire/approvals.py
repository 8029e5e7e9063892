"""Signed approvals: the gate signs each batch it approved; the executor runs only what verifies.

HMAC-SHA256 over the RFC 8785 canonical JSON of the whole batch (turn, step, transcript,
every call and its verdict) but the signature fields. `key_id` names the key so keys can
rotate: every configured key verifies, the first one signs.

A person's decision on a held call (ApprovalDecided) is signed the same way with a decision
key (ROUNDTRIP_DECISION_KEYS, held by the people who decide, not by the gate or executors),
and binds the exact call: turn, tool_use id and `input_digest` of the name and input shown.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from pydantic import BaseModel

from roundtrip._kernel.wire.events import ApprovalDecided
from roundtrip._kernel.wire.fingerprints import canonical_json


class ApprovalError(Exception):
    """A batch that must not run: unsigned, unknown key, or signature mismatch."""


def parse_keys(spec: str) -> dict[str, bytes]:
    keys: dict[str, bytes] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        key_id, sep, secret = part.partition(":")
        if not sep or not key_id or not secret:
            raise ValueError(f"approval key {part[:12]!r}... must look like key_id:secret")
        keys[key_id] = secret.encode()
    if not keys:
        raise ValueError("at least one approval key is required")
    return keys


def _digest(message: BaseModel, secret: bytes) -> str:
    body = canonical_json(message.model_dump(mode="json", exclude={"key_id", "signature"}))
    return hmac.new(secret, body, hashlib.sha256).hexdigest()


class Signer:
    """Signs and verifies messages with `key_id` and `signature` fields (batches; decisions with their own keys)."""

    what = "batch"
    who = "the gate did not approve it"

    def __init__(self, keys: dict[str, bytes]) -> None:
        self._keys = keys
        self._signing_id = next(iter(keys))

    def sign(self, message):
        return message.model_copy(
            update={"key_id": self._signing_id, "signature": _digest(message, self._keys[self._signing_id])}
        )

    def verify(self, message) -> None:
        if not message.signature or not message.key_id:
            raise ApprovalError(f"unsigned {self.what}: {self.who}")
        secret = self._keys.get(message.key_id)
        if secret is None:
            raise ApprovalError(f"{self.what} signed with unknown key id {message.key_id!r}")
        if not hmac.compare_digest(_digest(message, secret), message.signature):
            raise ApprovalError(f"signature mismatch: the {self.what} was tampered with or signed for another turn")


class DecisionSigner(Signer):
    """Signs and verifies a person's ApprovalDecided (ROUNDTRIP_DECISION_KEYS)."""

    what = "decision"
    who = "no decision key signed it"

    def sign(self, message: ApprovalDecided) -> ApprovalDecided:
        return super().sign(message)


def input_digest(name: str, tool_input: Any) -> str:
    """What an approval binds: SHA-256 of the canonical JSON of the tool name and its exact input (RFC 8785 of the raw
    values, not normalised: the digest is of the input as it runs)."""
    return hashlib.sha256(canonical_json({"name": name, "input": tool_input})).hexdigest()


def approval_id_for(turn_id: str, step: int, tool_use_id: str) -> str:
    """Deterministic, so a redelivered batch requests the same approval."""
    return "appr_" + hashlib.sha256(f"{turn_id}\x00{step}\x00{tool_use_id}".encode()).hexdigest()[:20]


def in_tool_use_order(messages: list[dict[str, Any]], results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """tool_result blocks in the order of the tool_use blocks of the last assistant message (the API's contract)."""
    order: dict[Any, int] = {}  # tool_use id -> its place (a block without an id: None)
    for message in reversed(messages):
        if message.get("role") == "assistant" and isinstance(message.get("content"), list):
            order = {
                b.get("id"): i
                for i, b in enumerate(message["content"])
                if isinstance(b, dict) and b.get("type") == "tool_use"
            }
            break
    return sorted(results, key=lambda b: order.get(b.get("tool_use_id"), len(order)))
