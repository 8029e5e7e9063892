"""Fixtures the unit tests share (pytest finds them here; a test module names them as parameters only)."""

from __future__ import annotations

import pytest

from roundtrip._shop.agent.client import ShopClient


@pytest.fixture
async def shop(tmp_path):
    """A client of the demo shop app, in-process on SQLite (no HTTP server)."""
    from tests.shop import in_process

    async with in_process(f"sqlite+aiosqlite:///{tmp_path / 'shop.db'}") as transport:
        client = ShopClient("http://shop", timeout=5, transport=transport)
        yield client
        await client.aclose()
