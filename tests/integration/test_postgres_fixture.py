"""The `postgres_url` fixture gives a real, writable PostgreSQL database."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

pytestmark = pytest.mark.postgres


async def test_postgres_url_is_a_real_database(postgres_url: str) -> None:
    assert postgres_url.startswith("postgresql+asyncpg://")
    engine = create_async_engine(postgres_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(text("create table if not exists fixture_check (id int primary key)"))
            await conn.execute(text("insert into fixture_check values (1) on conflict do nothing"))
            assert (await conn.execute(text("select count(*) from fixture_check"))).scalar_one() == 1
            assert "PostgreSQL" in (await conn.execute(text("select version()"))).scalar_one()
    finally:
        await engine.dispose()
