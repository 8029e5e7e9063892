"""The base of every message on the wire: a field a sender adds that the model does not know is refused."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
