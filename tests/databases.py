"""Databases for the tests and the benchmark: a throwaway PostgreSQL server (`PostgresServer`), and the stores'
tables brought to this code's revision (`migrated`), as `roundtrip db upgrade` (and `roundtrip up`) does before
any service starts."""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from alembic import command

from roundtrip._broker.embedded import die_with_parent_preexec, free_port
from roundtrip._kernel.database import make_engine, run_on
from roundtrip._kernel.migrations import STORES
from roundtrip._kernel.migrations.schema import alembic_config, upgrade

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


class PostgresServer:
    """A throwaway PostgreSQL server: initdb into a temp folder, postgres on a free port.

    `durable=False` (the tests') turns fsync and synchronous commit off; the benchmark runs it with the server's
    own durable defaults, as production does (docs/benchmarks.md)."""

    def __init__(self, bindir: Path, durable: bool = False, crash_safe: bool = False):
        self.bindir, self.durable = bindir, durable
        # crash_safe: a commit is written to the OS before it returns (synchronous_commit on), so it survives a SIGKILL
        # of the server (not of the machine: fsync stays off); the crash tests need that, a benchmark's durable more
        self.crash_safe = crash_safe
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
        self._launch()
        atexit.register(self.stop)
        self._wait_ready(60)
        self._run(str(self.bindir / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", PG_USER, PG_DATABASE)
        return f"postgresql+asyncpg://{PG_USER}@127.0.0.1:{self.port}/{PG_DATABASE}"

    def halt(self, sig: signal.Signals = signal.SIGINT) -> None:
        """Stop the server and keep its data: SIGINT is a fast shutdown, SIGKILL a crash (its whole process group,
        backends included, as an OOM kill or a lost node does); `resume()` starts it again on the same port."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        if sig == signal.SIGKILL:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.send_signal(sig)
        proc.wait(30)
        if sig == signal.SIGKILL:  # the backends share the group; wait until none holds the port or the shared memory
            deadline = time.monotonic() + 10
            while (
                time.monotonic() < deadline
                and subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True).returncode == 0
            ):
                time.sleep(0.05)  # poll interval: the server's processes exiting

    def resume(self, timeout: float = 60) -> None:
        """Start the halted server again on its data (crash recovery after a SIGKILL)."""
        (self.data / "postmaster.pid").unlink(missing_ok=True)  # a crashed postmaster leaves it behind
        self._launch()
        self._wait_ready(timeout)

    def _launch(self) -> None:
        options = {
            "listen_addresses": "127.0.0.1",
            "port": self.port,
            "unix_socket_directories": str(self.sockets),
            "max_connections": 200,
            "logging_collector": "off",
        }
        if not self.durable:
            options |= {
                "fsync": "off",
                "synchronous_commit": "on" if self.crash_safe else "off",
                "full_page_writes": "off",
                "shared_buffers": "32MB",
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
            time.sleep(0.1)  # poll interval: the server accepting connections

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


def new_database(server_url: str) -> str:
    """The URL of a new, empty database on the PostgreSQL server of `server_url` (from synchronous code: a fixture)."""
    from sqlalchemy import text
    from sqlalchemy.engine import make_url
    from sqlalchemy.ext.asyncio import create_async_engine

    name = f"t_{uuid.uuid4().hex[:12]}"

    async def create() -> None:
        admin = create_async_engine(server_url, isolation_level="AUTOCOMMIT")
        try:
            async with admin.connect() as conn:
                await conn.execute(text(f"CREATE DATABASE {name}"))
        finally:
            await admin.dispose()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # its own event loop, whatever runs on the caller's
        pool.submit(asyncio.run, create()).result(60)
    return make_url(server_url).set(database=name).render_as_string(hide_password=False)


async def migrated(url: str) -> str:
    """`url`, its ledger and conversation tables at this code's head."""
    await upgrade(url, STORES)
    return url


async def migrated_to(url: str, revision: str) -> None:
    """`url` at `revision`, behind this code's head: what an older roundtrip left (Alembic's own upgrade)."""
    config = alembic_config()

    def work(conn) -> None:
        config.attributes["connection"] = conn  # env.py runs on it
        command.upgrade(config, revision)

    await run_on(make_engine(url), work, write=True)
