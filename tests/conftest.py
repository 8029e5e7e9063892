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

import atexit
import contextlib
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from services.broker.embedded import EmbeddedKafka, die_with_parent_preexec, free_port
from services.kernel.admin import create_topics
from tests.processes import embedded_kafka

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

PG_USER = "roundtrip"
PG_DATABASE = "roundtrip_test"


def find_pg_bindir() -> Path | None:
    """Folder holding initdb and postgres: $ROUNDTRIP_TEST_PG_BINDIR, pg_config, Debian's layout, PATH."""
    candidates: list[Path] = []
    if os.environ.get("ROUNDTRIP_TEST_PG_BINDIR"):
        candidates.append(Path(os.environ["ROUNDTRIP_TEST_PG_BINDIR"]))
    if shutil.which("pg_config"):
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=True)
            candidates.append(Path(out.stdout.strip()))

    def version_key(p: Path) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", p.parent.name)) or (0,)

    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=version_key, reverse=True)
    if shutil.which("initdb"):
        candidates.append(Path(shutil.which("initdb")).resolve().parent)  # type: ignore[arg-type]
    for d in candidates:
        if (d / "initdb").is_file() and (d / "postgres").is_file():
            return d
    return None


class _Postgres:
    """A throwaway PostgreSQL server: initdb into a temp folder, postgres on a free port."""

    def __init__(self, bindir: Path):
        self.bindir = bindir
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="roundtrip-pg-"))  # not under pytest's 0700 tmp: see below
        self.data = self.root / "data"
        self.sockets = self.root / "sock"
        self.log = self.root / "postgres.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.run_as: dict[str, object] = {}
        if os.geteuid() == 0:  # postgres refuses to run as root: run it as the `postgres` user
            try:
                user = pwd.getpwnam("postgres")
            except KeyError:
                user = pwd.getpwnam("nobody")
            self.run_as = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
            os.chown(self.root, user.pw_uid, user.pw_gid)
        self.sockets.mkdir()
        if self.run_as:
            os.chown(self.sockets, self.run_as["user"], self.run_as["group"])  # type: ignore[arg-type]

    def _run(self, *cmd: str) -> None:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, cwd=self.root, timeout=120, **self.run_as
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")

    def start(self) -> str:
        self._run(
            str(self.bindir / "initdb"), "-D", str(self.data), "-U", PG_USER, "--auth=trust",
            "-E", "UTF8", "--no-locale", "--no-sync", "--no-instructions",
        )  # fmt: skip
        options = {
            "listen_addresses": "127.0.0.1",
            "port": self.port,
            "unix_socket_directories": str(self.sockets),
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "shared_buffers": "32MB",
            "max_connections": 200,
            "logging_collector": "off",
        }
        cmd = [str(self.bindir / "postgres"), "-D", str(self.data)]
        for k, v in options.items():
            cmd += ["-c", f"{k}={v}"]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.root,
                start_new_session=True,
                preexec_fn=die_with_parent_preexec(signal.SIGINT),  # fast shutdown if pytest dies
                **self.run_as,  # type: ignore[arg-type]
            )
        atexit.register(self.stop)
        self._wait_ready(60)
        self._run(str(self.bindir / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", PG_USER, PG_DATABASE)
        return f"postgresql+asyncpg://{PG_USER}@127.0.0.1:{self.port}/{PG_DATABASE}"

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        isready = self.bindir / "pg_isready"
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited with code {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            args = [str(isready), "-q", "-h", "127.0.0.1", "-p", str(self.port), "-U", PG_USER, "-d", "postgres"]
            if subprocess.run(args, stdin=subprocess.DEVNULL).returncode == 0:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"postgres not ready after {timeout}s:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # "fast" shutdown
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)


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
    server = _Postgres(bindir)
    try:
        url = server.start()
    except Exception as e:
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
