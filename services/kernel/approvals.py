"""Signed approvals: the gate signs each batch it approved; the executor runs only what verifies.

HMAC-SHA256 over the RFC 8785 canonical JSON of the whole batch (turn, step, transcript,
every call and its verdict) but the signature fields. `key_id` names the key so keys can
rotate: every configured key verifies, the first one signs.
"""

from __future__ import annotations

import hashlib
import hmac

from services.kernel.events import ExecuteToolBatch
from services.kernel.fingerprints import canonical_json


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


def _digest(batch: ExecuteToolBatch, secret: bytes) -> str:
    body = canonical_json(batch.model_dump(mode="json", exclude={"key_id", "signature"}))
    return hmac.new(secret, body, hashlib.sha256).hexdigest()


class Signer:
    def __init__(self, keys: dict[str, bytes]) -> None:
        self._keys = keys
        self._signing_id = next(iter(keys))

    def sign(self, batch: ExecuteToolBatch) -> ExecuteToolBatch:
        return batch.model_copy(
            update={"key_id": self._signing_id, "signature": _digest(batch, self._keys[self._signing_id])}
        )

    def verify(self, batch: ExecuteToolBatch) -> None:
        if not batch.signature or not batch.key_id:
            raise ApprovalError("unsigned batch: the gate did not approve it")
        secret = self._keys.get(batch.key_id)
        if secret is None:
            raise ApprovalError(f"batch signed with unknown key id {batch.key_id!r}")
        if not hmac.compare_digest(_digest(batch, secret), batch.signature):
            raise ApprovalError("signature mismatch: the batch was tampered with or signed for another turn")
