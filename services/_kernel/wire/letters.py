"""The dead letters' events: a message a service could not process, and what a person did with it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from roundtrip._kernel.wire.message import Message


class DeadLettered(Message):
    """Event: a message a service could not process, with why, on that service's own dead letters."""

    service: str
    topic: str
    reason: str
    payload: str = Field(
        description="The original bytes for people to read: UTF-8 with replacement, the first 100,000 bytes"
    )
    payload_base64: str = Field("", description="The original bytes, all of them, base64 (lossless)")
    key: str | None = Field(None, description="The record's key as UTF-8 with replacement")
    key_base64: str | None = Field(None, description="The record's key bytes, base64 (lossless)")
    headers: list[dict[str, str]] = Field(
        default_factory=list, description="The record's headers: key and value_base64"
    )
    partition: int | None = None
    offset: int | None = None


class DeadLetterHandled(Message):
    """Event: a person re-drove or discarded a dead letter in the console, or a console released its claim on one (the
    re-drive could not be published). Keyed by the letter's id; every console replica reads the topic from its start:
    the first claim of a letter wins, and only a release of that very claim frees the letter again."""

    letter_id: str = Field(
        description="The dead letter's place: '<service>-<partition>-<offset>' on roundtrip.dead_letters.by.<service> "
        "('<partition>-<offset>' on the shared roundtrip.dead_letters of older fleets)"
    )
    action: Literal["redrive", "discard", "release"]
    claim: str = Field(description="The id of the claim this record makes (or, for a release, frees)")
    by: str = Field("", description="The signed-in person who re-drove or discarded it")
    at: float = Field(description="When, epoch seconds")
    note: str = Field("", description="Their reason")
    topic: str = Field("", description="Where a re-drive published the original record (its source topic)")
