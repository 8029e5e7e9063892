"""Fixtures shared by the whole test suite: the real Kafka broker, a real PostgreSQL, topic prefixes.

Session-scoped (started once, lazily, only when a test asks for them):
  kafka_broker     -> EmbeddedKafka | None   the embedded broker (None when an external one is used)
  kafka_bootstrap  -> str                    "127.0.0.1:PORT" of Apache Kafka (KRaft, one node)
  postgres_url     -> str                    "postgresql+asyncpg://roundtrip@127.0.0.1:PORT/roundtrip_test"

Per test:
  topic_prefix     -> str                    unique "t<hex>." so tests sharing the broker never meet
  postgres_database -> str                   URL of a new, empty database on that server (dropped after the test)
  make_topics      -> async (bootstrap, prefix, partitions=2, executor_partitions=None) -> list[str]
  kafka_topics     -> str                    the test's prefix, with every fleet topic created under it

Environment:
  ROUNDTRIP_TEST_KAFKA_BOOTSTRAP   use this Kafka instead of starting one
  ROUNDTRIP_TEST_POSTGRES_URL      use this database instead of starting a server
  ROUNDTRIP_TEST_PG_BINDIR         folder of initdb/postgres (default: pg_config --bindir, /usr/lib/postgresql/*/bin)

The event loop: pyproject sets asyncio_mode=auto and session-scoped loops for tests and
fixtures, so every async test and fixture shares one loop (clients made in a session fixture
stay usable in tests).
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from roundtrip._broker.embedded import EmbeddedKafka
from tests.ci_skips import pytest_runtest_makereport  # noqa: F401 - a hook: in CI a skip fails
from tests.databases import PostgresServer, find_pg_bindir
from tests.processes import embedded_kafka
from tests.topics import create_topics

# -- markers by folder: `pytest -m "not e2e"` etc. ---------------------------------------------


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        for marker in ("integration", "e2e", "chaos"):
            if marker in parts:
                item.add_marker(marker)


def _say(msg: str) -> None:
    """Progress that should reach the terminal even while pytest captures output."""
    print(msg, file=sys.__stderr__, flush=True)


# -- Kafka ------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedKafka | None]:
    """The session's embedded Apache Kafka (None when ROUNDTRIP_TEST_KAFKA_BOOTSTRAP is set)."""
    if os.environ.get("ROUNDTRIP_TEST_KAFKA_BOOTSTRAP"):
        yield None
        return
    with embedded_kafka(tmp_path_factory.mktemp("kafka")) as kafka:
        yield kafka


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_broker: EmbeddedKafka | None) -> str:
    """Bootstrap servers of the session's Kafka: "127.0.0.1:PORT"."""
    if kafka_broker is None:
        return os.environ["ROUNDTRIP_TEST_KAFKA_BOOTSTRAP"]
    return kafka_broker.bootstrap


@pytest.fixture
def topic_prefix() -> str:
    """A unique topic prefix per test ("t<hex>."), so tests sharing one broker never see each other."""
    return f"t{uuid.uuid4().hex[:12]}."


async def make_topics(
    bootstrap: str, prefix: str, partitions: int = 2, executor_partitions: int | None = None
) -> list[str]:
    """Create every fleet topic under `prefix` (idempotent); return the names created."""
    return await create_topics(bootstrap, prefix, partitions, executor_partitions)


@pytest.fixture(name="make_topics")
def make_topics_fixture() -> Callable[..., Awaitable[list[str]]]:
    """The `make_topics(bootstrap, prefix, partitions=2, executor_partitions=None)` helper."""
    return make_topics


@pytest_asyncio.fixture
async def kafka_topics(kafka_bootstrap: str, topic_prefix: str) -> AsyncIterator[str]:
    """The test's topic prefix, with all fleet topics already created under it (2 partitions each)."""
    await make_topics(kafka_bootstrap, topic_prefix)
    yield topic_prefix


# -- PostgreSQL -------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """SQLAlchemy URL of a throwaway PostgreSQL database (a real server, started for the session)."""
    if os.environ.get("ROUNDTRIP_TEST_POSTGRES_URL"):
        yield os.environ["ROUNDTRIP_TEST_POSTGRES_URL"]
        return
    bindir = find_pg_bindir()
    if bindir is None:
        pytest.fail(
            "PostgreSQL server binaries (initdb, postgres) not found. Install them "
            "(Debian/Ubuntu: `apt-get install postgresql`; macOS: `brew install postgresql`), set "
            "ROUNDTRIP_TEST_PG_BINDIR to their folder, or set ROUNDTRIP_TEST_POSTGRES_URL to an existing database.",
            pytrace=False,
        )
    server = PostgresServer(bindir)
    try:
        url = server.start()
    except Exception as e:  # noqa: BLE001 - whatever stops it, one line says so (pytest.fail raises)
        server.stop()
        pytest.fail(f"could not start a throwaway PostgreSQL from {bindir}: {e}", pytrace=False)
    try:
        yield url
    finally:
        server.stop()


@pytest_asyncio.fixture
async def postgres_database(postgres_url: str) -> AsyncIterator[str]:
    """A new, empty database on the session's PostgreSQL server (migration tests need one of their own)."""
    from sqlalchemy import text
    from sqlalchemy.engine import make_url
    from sqlalchemy.ext.asyncio import create_async_engine

    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = create_async_engine(postgres_url, isolation_level="AUTOCOMMIT")
    try:
        async with admin.connect() as conn:
            await conn.execute(text(f"CREATE DATABASE {name}"))
        yield make_url(postgres_url).set(database=name).render_as_string(hide_password=False)
        async with admin.connect() as conn:
            await conn.execute(text(f"DROP DATABASE {name} WITH (FORCE)"))
    finally:
        await admin.dispose()
