"""For the tests that open the fleet's stores directly: their database first brought to this code's revision,
as `roundtrip db upgrade` (and `roundtrip up`) does before any service starts."""

from __future__ import annotations

from services.kernel.migrations.schema import upgrade


async def migrated(url: str) -> str:
    """`url`, its ledger and conversation tables at this code's head."""
    await upgrade(url)
    return url
