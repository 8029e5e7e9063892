"""The personas: each a pure function Transcript -> Reply (content blocks + stop reason).

`mix` is not a persona of its own: it picks one of MIX by a hash of the first user message,
so a load run gets a stable blend and a given conversation always meets the same persona.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from ..transcript import Transcript
from . import careful, careless, direct, oddities, oversized, parallel, runaway, sloppy
from ._common import Reply

Persona = Callable[[Transcript], Reply]

PERSONAS: dict[str, Persona] = {
    "careful": careful.decide,
    "careless": careless.decide,
    "stubborn": runaway.stubborn,
    "looping": runaway.looping,
    "flailing": runaway.flailing,
    "sloppy": sloppy.decide,
    "parallel": parallel.decide,
    "refusing": oddities.refusing,
    "terse": oddities.terse,
    "bloated": oversized.bloated,
    "deep": oversized.deep,
    "direct": direct.decide,  # the customer's words are the call: any agent's tools
}
MIX = ("careful", "careless", "stubborn", "sloppy", "parallel")
NAMES = (*PERSONAS, "mix")


def resolve(name: str, first_user_text: str) -> str:
    """A concrete persona name for `name` (which may be 'mix'); KeyError when unknown."""
    if name == "mix":
        digest = hashlib.sha256(first_user_text.encode()).digest()
        return MIX[int.from_bytes(digest[:8], "big") % len(MIX)]
    if name not in PERSONAS:
        raise KeyError(name)
    return name


__all__ = ["MIX", "NAMES", "PERSONAS", "Persona", "Reply", "resolve"]
