"""Canonical JSON (what is signed) and call fingerprints (what the guard compares to find repeats).

Canonical JSON is RFC 8785 (JCS) of the values exactly as they are: key order, whitespace and number spelling
(1.0 vs 1) do not change it, and nothing else is rewritten, so the bytes the gate signs and the approval digest
cover are the input the executor runs. A fingerprint is a different question (is this the same call again?):
there visually identical input is the same call, so strings are NFC-normalised first.
"""

from __future__ import annotations

import hashlib
import unicodedata
from typing import Any

import rfc8785


def _normalise(value: Any) -> Any:
    if isinstance(value, str):
        return unicodedata.normalize("NFC", value)
    if isinstance(value, dict):
        return {_normalise(k): _normalise(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normalise(v) for v in value]
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


def canonical_json(value: Any) -> bytes:
    """RFC 8785 of the raw values: what a signature covers (two Unicode spellings are two inputs to a tool)."""
    return rfc8785.dumps(value)


def normalised_json(value: Any) -> bytes:
    """RFC 8785 of the values with every string NFC-normalised: for comparing calls, never for signing."""
    return rfc8785.dumps(_normalise(value))


def fingerprint(tool_name: str, tool_input: Any) -> str:
    try:
        body = normalised_json(tool_input)
    except (rfc8785.CanonicalizationError, TypeError, ValueError):
        body = repr(tool_input).encode()
    return f"{tool_name}:{hashlib.sha256(body).hexdigest()[:16]}"
