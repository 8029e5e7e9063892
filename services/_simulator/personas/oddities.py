"""Personas for the rarer stop reasons, each of which the fleet must end a turn on.

refusing: stop_reason "refusal" with no content.
terse:    one short sentence; stop_reason "stop_sequence" (the request's first stop sequence)
          when the request has stop_sequences, else "end_turn".
"""

from __future__ import annotations

from ..transcript import Transcript
from ._common import Reply

TERSE_TEXT = "Thanks for reaching out, we're on it."


def refusing(t: Transcript) -> Reply:
    return Reply([], "refusal")


def terse(t: Transcript) -> Reply:
    content = [{"type": "text", "text": TERSE_TEXT}]
    if t.stop_sequences:
        return Reply(content, "stop_sequence", t.stop_sequences[0])
    return Reply(content, "end_turn")
