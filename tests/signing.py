"""Fresh Ed25519 key pairs for tests, in the settings' own form (`key_id:base64`), made as `roundtrip keys` makes them.

pair("k1")                 a Pair: .signing (key_id:private), .verify (key_id:public), .signer, .verifier
key_settings()             the four key settings of a fleet with fresh pairs (Settings(**key_settings()))
key_environment()          the same as ROUNDTRIP_* variables, for a service started as a process
"""

from __future__ import annotations

from dataclasses import dataclass

from roundtrip._kernel.wire.approvals import DecisionVerifier, Signer, Verifier, new_pair


@dataclass(frozen=True)
class Pair:
    key_id: str
    private: str
    public: str

    @property
    def signing(self) -> str:
        return f"{self.key_id}:{self.private}"

    @property
    def verify(self) -> str:
        return f"{self.key_id}:{self.public}"

    @property
    def signer(self) -> Signer:
        return Signer.of(self.signing, "TEST_SIGNING_KEY")

    @property
    def verifier(self) -> Verifier:
        return Verifier.of(self.verify, "TEST_VERIFY_KEYS")

    @property
    def decisions(self) -> DecisionVerifier:
        return DecisionVerifier.of(self.verify, "TEST_VERIFY_KEYS")


def pair(key_id: str = "k1") -> Pair:
    return Pair(key_id, *new_pair())


def key_settings(batch_id: str = "k1", decision_id: str = "ops1") -> dict[str, str]:
    """Settings keyword arguments: fresh batch and decision pairs (never the published development ones)."""
    batch, decision = pair(batch_id), pair(decision_id)
    return {
        "batch_signing_key": batch.signing,
        "batch_verify_keys": batch.verify,
        "decision_signing_key": decision.signing,
        "decision_verify_keys": decision.verify,
    }


def key_environment(batch_id: str = "k1", decision_id: str = "ops1") -> dict[str, str]:
    return {f"ROUNDTRIP_{name.upper()}": value for name, value in key_settings(batch_id, decision_id).items()}
