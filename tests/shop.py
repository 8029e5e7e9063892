"""The demo shop inside the test's process (lifespan included), reached through an httpx transport."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx

from roundtrip._shop.app import create_app


@asynccontextmanager
async def in_process(database_url: str, seed: bool = True) -> AsyncIterator[httpx.ASGITransport]:
    app = create_app(database_url, seed=seed)
    async with app.router.lifespan_context(app):
        yield httpx.ASGITransport(app=app)
