"""The two Ed25519 key pairs of the fleet, each one concern: `BatchKeys` (the gate signs batches, the executors and
the guard verify) and `ApprovalSettings` (people's decisions: the console and `roundtrip approvals` sign, the gate and
the guard verify), with the published development pairs a service outside development refuses."""

from __future__ import annotations

from pydantic import (
    Field,
    SecretStr,
)

from roundtrip._kernel.settings.base import KEYS, Concern

# Published here, so anyone can sign with them: outside development a service that holds one refuses to start.
DEV_BATCH_SIGNING_KEY = "dev1:/t+ECEMeaxV7ZzdJxjb5iuhb57b4Y0T0YUBzzbViP0k="
DEV_BATCH_VERIFY_KEYS = "dev1:ZPXmekSmiDVxXLUU+HkczA5SeM96Cts84D66Z2KPGuA="
DEV_DECISION_SIGNING_KEY = "ops1:VY8ZvLjJia3z3LHbdEIGtwV3hd+O3myBXulDO6DbZMk="
DEV_DECISION_VERIFY_KEYS = "ops1:yYB9AT5pdbquSTalmxoGUSTYoqt+JDM7RfbFPKzd9ns="
# Retired HMAC settings: a service that finds one set says what replaced it and stops.
RETIRED_KEY_SETTINGS = {
    "ROUNDTRIP_APPROVAL_KEYS": "ROUNDTRIP_BATCH_SIGNING_KEY (the gate) and ROUNDTRIP_BATCH_VERIFY_KEYS (the executors"
    " and the guard)",
    "ROUNDTRIP_DECISION_KEYS": "ROUNDTRIP_DECISION_SIGNING_KEY (the console, `roundtrip approvals`) and "
    "ROUNDTRIP_DECISION_VERIFY_KEYS (the gate and the guard)",
}


def _holds_key(keys: str, published: str) -> bool:
    secret = published.partition(":")[2]
    return any(part.partition(":")[2].strip() == secret for part in keys.split(","))


class BatchKeys(Concern):
    """Ed25519 key pairs (`roundtrip keys` makes one): the gate signs each batch it approved, and each call it holds
    for a person, with `ROUNDTRIP_BATCH_SIGNING_KEY`; the executors and the guard check with the public keys of
    `ROUNDTRIP_BATCH_VERIFY_KEYS` and cannot sign. Rotate by adding the new public key to the verify keys everywhere,
    then giving the gate the new private key, then removing the old public key. A value may be `file:<path>` (a mounted
    Secret). The development pair is published, so outside the embedded development fleet (Kafka configured by
    `ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS` and `ROUNDTRIP_ENV` not `development`) a service that holds it refuses to start,
    as it does with a placeholder (`CHANGE-ME`) or a malformed key anywhere."""

    heading = "signed batches: the gate signs, executors and the guard verify"

    batch_signing_key: SecretStr = Field(
        SecretStr(DEV_BATCH_SIGNING_KEY),
        json_schema_extra=KEYS,
        description=(
            "The gate's `key_id:private` (base64 of the 32-byte Ed25519 key) that signs approved batches and holds; "
            "only the gate holds it"
        ),
    )
    batch_verify_keys: str = Field(
        DEV_BATCH_VERIFY_KEYS,
        description=(
            "Comma-separated `key_id:public` keys (base64) executors and the guard check the gate's signatures with; "
            "every listed key verifies (rotation)"
        ),
    )

    @property
    def dev_batch_key_in_use(self) -> bool:
        return _holds_key(self.batch_signing_key.get_secret_value(), DEV_BATCH_SIGNING_KEY) or _holds_key(
            self.batch_verify_keys, DEV_BATCH_VERIFY_KEYS
        )


class ApprovalSettings(Concern):
    """People's decisions are signed with an Ed25519 key pair (`roundtrip keys decision`): the console and the
    operators' `roundtrip approvals` sign with `ROUNDTRIP_DECISION_SIGNING_KEY`; the gate and the guard check with the
    public keys of `ROUNDTRIP_DECISION_VERIFY_KEYS` and cannot sign. Rotation, files and the refusals at start are as
    for the batch pair."""

    heading = "approvals by a person"

    approval_timeout_s: float = Field(
        900.0,
        gt=0,
        description=(
            "How long a call waits for a decision; then the turn ends politely (`approval_timeout`) and the call never"
            " runs"
        ),
    )
    decision_signing_key: SecretStr = Field(
        SecretStr(DEV_DECISION_SIGNING_KEY),
        json_schema_extra=KEYS,
        description=(
            "The `key_id:private` Ed25519 key people's decisions are signed with: the console's and `roundtrip "
            "approvals`' only; the published default is refused outside development while approvals are configured "
            "(the agent has an approval rule that can hold a call)"
        ),
    )
    decision_verify_keys: str = Field(
        DEV_DECISION_VERIFY_KEYS,
        description=(
            "Comma-separated `key_id:public` keys the gate and the guard check people's decisions with (rotation: "
            "every listed key verifies)"
        ),
    )

    @property
    def dev_decision_key_in_use(self) -> bool:
        return _holds_key(self.decision_signing_key.get_secret_value(), DEV_DECISION_SIGNING_KEY) or _holds_key(
            self.decision_verify_keys, DEV_DECISION_VERIFY_KEYS
        )
