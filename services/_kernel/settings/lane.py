"""The batch lane's concern: which lane a request takes by default, a batch turn's deadline, and how the model service
gathers, submits and polls Message Batches (services/_model/batches.py, docs/decisions/batch-lane.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from roundtrip._kernel.settings.base import Concern

BATCH_PLATFORMS = ("anthropic",)  # the platforms whose Messages API has Message Batches the fleet uses


class BatchLane(Concern):
    heading = "the batch lane: model calls through Message Batches, at half the price, answered within hours"

    default_lane: Literal["interactive", "batch"] = Field(
        "interactive",
        description=(
            "The lane of a request that names none: `batch` sends every model call of its turn through a Message "
            "Batch (the Anthropic API only: on another platform the fleet refuses to start with it)"
        ),
    )
    batch_deadline_s: float = Field(
        86400.0, gt=0, description="A batch turn is ended when it runs longer than this (24 h: a batch's own limit)"
    )
    max_running_batch_turns: int = Field(
        10000,
        ge=1,
        description=(
            "Batch turns the gateway runs at once, beside (not within) max_running_turns: a batch turn waiting for "
            "its batch holds a row, not a slot of the interactive turns"
        ),
    )
    batch_max_calls: int = Field(
        100, ge=1, le=100000, description="The model service submits a batch as soon as this many calls wait for one"
    )
    batch_max_wait_s: float = Field(
        30.0, gt=0, description="Or as soon as the oldest call waiting for a batch has waited this long"
    )
    batch_poll_s: float = Field(
        10.0, gt=0, description="First look at an open batch this long after its submission, then twice as long each"
    )
    batch_poll_max_s: float = Field(
        60.0, gt=0, description="The longest pause between two looks at an open batch (the backoff's cap)"
    )
    batch_retry_direct_within_s: float = Field(
        3600.0,
        ge=0,
        description=(
            "A call whose batch result is errored or expired is tried once more: as a direct call when its turn's "
            "deadline is less than this away, else in the next batch; a second failure ends the turn (model_error)"
        ),
    )
