"""`roundtrip keys`: a new Ed25519 key pair for the gate's batches or for people's decisions.

It prints two lines in the form of the environment: the private key, for the one signer's Secret (the gate; the
console and the operator's `roundtrip approvals`), and the public key, for the verifiers' configuration (the executors
and the guard; the gate and the guard). Nothing is written anywhere else: the private key exists in this output only.
"""

from __future__ import annotations

import time
from enum import StrEnum

from roundtrip._kernel.wire.approvals import KEY_ID, new_pair


class Purpose(StrEnum):
    BATCH = "batch"
    DECISION = "decision"


WHO = {
    Purpose.BATCH: ("the gate only", "the executors and the guard"),
    Purpose.DECISION: ("the console and the operators who run `roundtrip approvals`", "the gate and the guard"),
}


def default_key_id(purpose: Purpose) -> str:
    """A key id that differs from the last rotation's: the purpose and today's date."""
    return f"{purpose.value}-{time.strftime('%Y%m%d')}"


def pair_lines(purpose: Purpose, key_id: str) -> list[str]:
    """The lines `roundtrip keys` prints: a comment and a `VARIABLE=key_id:base64` line for each half of a new pair."""
    if not KEY_ID.fullmatch(key_id):
        raise ValueError(f"key id {key_id!r}: 1 to 64 letters, digits, '.', '_' or '-'")
    private, public = new_pair()
    signer, verifiers = WHO[purpose]
    variable = f"ROUNDTRIP_{purpose.value.upper()}"
    return [
        f"# private: a Secret for {signer}; never a ConfigMap, an image or a log",
        f"{variable}_SIGNING_KEY={key_id}:{private}",
        f"# public: for {verifiers}; to rotate, add it to the list (comma-separated) before the signer switches",
        f"{variable}_VERIFY_KEYS={key_id}:{public}",
    ]
