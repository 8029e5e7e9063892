"""Canonical JSON and call fingerprints (tool name + hash of the canonical input).

Canonical JSON is RFC 8785 (JCS): key order, whitespace and number spelling (1.0 vs 1)
do not change it. Strings are NFC-normalised first, so visually identical input is too.
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
    return rfc8785.dumps(_normalise(value))


def fingerprint(tool_name: str, tool_input: Any) -> str:
    try:
        body = canonical_json(tool_input)
    except (rfc8785.CanonicalizationError, TypeError, ValueError):
        body = repr(tool_input).encode()
    return f"{tool_name}:{hashlib.sha256(body).hexdigest()[:16]}"
