"""Signed approvals: the gate signs each batch it approved and each hold; the executor runs only what verifies.

Ed25519 over the RFC 8785 canonical JSON of the whole message but its signature fields. Signing takes the private key,
checking only the public one, so a process that checks cannot sign: only the gate holds the batch signing key, only
the console (and `roundtrip approvals`) the decision signing key. `key_id` names the key so keys can rotate. A person's
decision binds the exact call: turn, tool_use id and the digest of the name and input shown; a hold's signature covers
every word the approver is shown, and its approval id. Keys and the hold's versions: docs/approvals.md.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from pathlib import Path
from typing import Any, Self, TypeVar

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat
from pydantic import BaseModel

from roundtrip._kernel.wire.events import (
    ApprovalDecided,
    ApprovalHold,
    ApprovalRequested,
    CheckedCall,
    ExecuteToolBatch,
    Turn,
)
from roundtrip._kernel.wire.fingerprints import canonical_json

Signed = TypeVar("Signed", ExecuteToolBatch, ApprovalDecided)
KEY_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
PLACEHOLDER = "CHANGE-ME"
FILE_PREFIX = "file:"


class ApprovalError(Exception):
    """A batch, decision or hold that must not act: unsigned, unknown key, or signature mismatch."""


class KeyConfigError(ValueError):
    """A key setting that cannot be used; its message names the setting and the entry, never the key's bytes."""


def setting_text(value: str, setting: str) -> str:
    value = value.strip()
    if not value.startswith(FILE_PREFIX):
        return value
    path = Path(value[len(FILE_PREFIX) :].strip())
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise KeyConfigError(
            f"{setting} names {path}, which cannot be read ({exc.strerror or type(exc).__name__})"
        ) from None


def _entries(text: str, setting: str) -> list[tuple[str, bytes]]:
    """(key id, 32 raw bytes) of each `key_id:base64` entry; KeyConfigError naming only the id and the place."""
    found: list[tuple[str, bytes]] = []
    for place, part in enumerate(filter(None, (p.strip() for p in text.split(","))), start=1):
        key_id, sep, encoded = (s.strip() for s in part.partition(":"))
        # the id is shown only when a colon parts it from the key: an entry without one may be all secret
        where = f"{setting} entry {place}" + (f" (key id {key_id!r})" if sep and KEY_ID.fullmatch(key_id) else "")
        if PLACEHOLDER.lower() in part.lower():
            raise KeyConfigError(
                f"{where} is the manifest's placeholder {PLACEHOLDER}: put a key made by `roundtrip keys` there"
            )
        if not sep or not KEY_ID.fullmatch(key_id) or not encoded:
            raise KeyConfigError(f"{where} must look like key_id:base64-key (make a pair with `roundtrip keys`)")
        try:
            raw = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise KeyConfigError(f"{where} is not base64 (make a pair with `roundtrip keys`)") from None
        if len(raw) != 32:
            raise KeyConfigError(
                f"{where} is {len(raw)} bytes, an Ed25519 key is 32 (make a pair with `roundtrip keys`)"
            )
        found.append((key_id, raw))
    if not found:
        raise KeyConfigError(f"{setting} holds no key (make a pair with `roundtrip keys`)")
    return found


def signing_key(value: str, setting: str) -> tuple[str, Ed25519PrivateKey]:
    entries = _entries(setting_text(value, setting), setting)
    if len(entries) > 1:
        raise KeyConfigError(
            f"{setting} holds {len(entries)} keys; it takes one (rotate by listing the old public key among the "
            "verify keys)"
        )
    key_id, raw = entries[0]
    return key_id, Ed25519PrivateKey.from_private_bytes(raw)


def verify_keys(value: str, setting: str) -> dict[str, Ed25519PublicKey]:
    keys: dict[str, Ed25519PublicKey] = {}
    for key_id, raw in _entries(setting_text(value, setting), setting):
        if key_id in keys:
            raise KeyConfigError(f"{setting} lists key id {key_id!r} twice")
        keys[key_id] = Ed25519PublicKey.from_public_bytes(raw)
    return keys


def new_pair() -> tuple[str, str]:
    """(base64 private, base64 public), what `roundtrip keys` prints."""
    private = Ed25519PrivateKey.generate()
    return _b64(private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())), public_of(private)


def public_of(private: Ed25519PrivateKey) -> str:
    return _b64(private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _body(message: BaseModel) -> bytes:
    return canonical_json(message.model_dump(mode="json", exclude={"key_id", "signature"}))


HOLD_WORDS = "approval hold v2"  # what a hold's signature covers; v1 covered the call, not the words a person reads


def _digest(value: Any) -> str:
    return hashlib.sha256(canonical_json(value)).hexdigest()


def _hold_words(
    approval_id: str,
    turn: Turn,
    step: int,
    call: CheckedCall,
    hold: ApprovalHold | ApprovalRequested,
    messages: list[dict[str, Any]],
    earlier: list[dict[str, Any]],
    ran: list[Any],
) -> bytes:
    """What the gate's signature of a hold covers: who waits, for which call, until when, and every word the person
    deciding is shown but the results of the batch's other calls, which the executor makes (their ids are signed)."""
    return canonical_json(
        {
            "signed": HOLD_WORDS,
            "approval_id": approval_id,
            "turn": turn.model_dump(mode="json"),
            "step": step,
            "tool_use_id": call.id,
            "tool": call.name,
            "input_sha256": hold.input_sha256,
            "reason": hold.reason,
            "entities": hold.entities,
            "expires_at": hold.expires_at,
            "messages_sha256": _digest(messages),
            "earlier_results_sha256": _digest(earlier),
            "ran": ran,
        }
    )


def _batch_words(batch: ExecuteToolBatch, call: CheckedCall) -> bytes:
    if call.hold is None:
        raise ApprovalError(f"call {call.id!r} is not held")
    return _hold_words(
        approval_id_for(batch.turn.turn_id, batch.step, call.id),
        batch.turn,
        batch.step,
        call,
        call.hold,
        batch.messages,
        batch.results,
        [c.id for c in batch.calls if not c.hold],  # the runner answers each of them, in this order, after `results`
    )


def _request_words(event: ApprovalRequested) -> bytes:
    if event.results_before > len(event.results):
        raise ApprovalError("approval request names more earlier results than it carries: it was edited")
    ran = [r.get("tool_use_id") if isinstance(r, dict) else None for r in event.results[event.results_before :]]
    return _hold_words(
        event.approval_id,
        event.turn,
        event.step,
        event.call,
        event,
        event.messages,
        event.results[: event.results_before],
        ran,
    )


class Signer:
    """Signs with the one private key it holds; it cannot verify: the verifiers are other processes."""

    def __init__(self, key_id: str, private: Ed25519PrivateKey) -> None:
        self.key_id, self._private = key_id, private

    @classmethod
    def of(cls, value: str, setting: str) -> Signer:
        return cls(*signing_key(value, setting))

    def sign(self, message: Signed) -> Signed:
        return message.model_copy(update={"key_id": self.key_id, "signature": self._private.sign(_body(message)).hex()})

    def sign_hold(self, batch: ExecuteToolBatch, call: CheckedCall) -> tuple[str, str]:
        """(key id, signature) of `call`'s hold as the executor will copy it from `batch` into an ApprovalRequested."""
        return self.key_id, self._private.sign(_batch_words(batch, call)).hex()

    def sign_request(self, event: ApprovalRequested) -> ApprovalRequested:
        """`event` with the hold signature the gate's batch would have given it, for a request built by hand."""
        signature = self._private.sign(_request_words(event)).hex()
        return event.model_copy(update={"hold_key_id": self.key_id, "hold_signature": signature})


class Verifier:
    """Checks what a Signer signed, with public keys only (any listed key id verifies: rotation)."""

    what = "batch"
    who = "the gate did not approve it"

    def __init__(self, keys: dict[str, Ed25519PublicKey]) -> None:
        self._keys = keys

    @classmethod
    def of(cls, value: str, setting: str) -> Self:
        return cls(verify_keys(value, setting))

    def _check(self, key_id: str, signature: str, body: bytes, what: str, who: str, mismatch: str = "") -> None:
        if not signature or not key_id:
            raise ApprovalError(f"unsigned {what}: {who}")
        public = self._keys.get(key_id)
        if public is None:
            raise ApprovalError(f"{what} signed with unknown key id {key_id!r}")
        try:
            public.verify(bytes.fromhex(signature), body)
        except (InvalidSignature, ValueError):
            raise ApprovalError(
                f"signature mismatch: the {what} " + (mismatch or "was tampered with or signed for another turn")
            ) from None

    def verify(self, message: ExecuteToolBatch | ApprovalDecided) -> None:
        self._check(message.key_id, message.signature, _body(message), self.what, self.who)

    def verify_hold(self, event: ApprovalRequested) -> None:
        """The gate's signature of the hold this request copies, over every word it shows, and its digest recomputed
        from the call it carries."""
        try:
            words = _request_words(event)
        except ValueError as exc:  # a number or string canonical JSON cannot carry: the gate signed no such request
            raise ApprovalError(f"approval request is not canonical JSON ({exc})") from None
        self._check(
            event.hold_key_id,
            event.hold_signature,
            words,
            "approval request",
            "the gate did not hold it",
            "was edited: it is not the hold the gate signed (its approval id, turn, customer, step, call, reason, "
            f"entities, transcript, results or deadline differ, or a gate older than {HOLD_WORDS!r} signed it)",
        )
        if event.input_sha256 != input_digest(event.call.name, event.call.input):  # the digest signed, another input
            raise ApprovalError("approval request's call is not the one its signed input digest names: it was edited")


class DecisionVerifier(Verifier):
    what = "decision"
    who = "no decision key signed it"


def input_digest(name: str, tool_input: Any) -> str:
    """What an approval binds: SHA-256 of the canonical JSON of the tool name and its raw input, as it runs."""
    return hashlib.sha256(canonical_json({"name": name, "input": tool_input})).hexdigest()


def approval_id_for(turn_id: str, step: int, tool_use_id: str) -> str:
    """Deterministic, so a redelivered batch requests the same approval."""
    return "appr_" + hashlib.sha256(f"{turn_id}\x00{step}\x00{tool_use_id}".encode()).hexdigest()[:20]


def in_tool_use_order(messages: list[dict[str, Any]], results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """tool_result blocks in the order of the tool_use blocks of the last assistant message (the API's contract)."""
    order: dict[Any, int] = {}
    for message in reversed(messages):
        if message.get("role") == "assistant" and isinstance(message.get("content"), list):
            order = {
                b.get("id"): i
                for i, b in enumerate(message["content"])
                if isinstance(b, dict) and b.get("type") == "tool_use"
            }
            break
    return sorted(results, key=lambda b: order.get(b.get("tool_use_id"), len(order)))


def published_in(value: str, setting: str, published: str) -> bool:
    """Whether a key setting (KeyConfigError when unusable) holds the published development key's bytes, any key id."""
    (signing_key if setting.endswith("_SIGNING_KEY") else verify_keys)(value, setting)
    ours = {raw for _, raw in _entries(published, "the development key")}
    return any(raw in ours for _, raw in _entries(setting_text(value, setting), setting))
