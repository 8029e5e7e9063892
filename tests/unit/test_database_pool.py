"""The PostgreSQL engines keep `ROUNDTRIP_DATABASE_POOL_SIZE` connections open and open none beyond them."""

from __future__ import annotations

import pytest

from roundtrip._kernel.database import make_engine
from roundtrip._kernel.settings import Settings


@pytest.mark.parametrize("size", [3, 25])
async def test_a_postgresql_engine_keeps_its_pool_and_opens_no_overflow(size):
    engine = make_engine("postgresql+asyncpg://roundtrip@127.0.0.1:1/ledger", pool_size=size)  # no connection made yet
    try:
        assert engine.pool.size() == size and engine.pool._max_overflow == 0  # the pool's own setting
    finally:
        await engine.dispose()


def test_the_pool_size_is_a_setting_with_a_bound(monkeypatch):
    assert Settings().database_pool_size == 10
    monkeypatch.setenv("ROUNDTRIP_DATABASE_POOL_SIZE", "40")
    assert Settings().database_pool_size == 40
    monkeypatch.setenv("ROUNDTRIP_DATABASE_POOL_SIZE", "0")
    with pytest.raises(Exception, match="database_pool_size"):
        Settings()
