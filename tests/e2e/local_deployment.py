"""A Manifest run as local processes with only the addresses replaced: nothing shared but Kafka and PostgreSQL.

    world = LocalWorld(kafka_bootstrap, postgres_url, otlp_endpoint, tag="k8s_1a2b")
    deployment = LocalDeployment(manifest, world, folder)
    try:
        await deployment.start(timeout=120)        # databases, init steps, every replica, until each is ready
        ...; await deployment.while_running(work)  # fails at once if a process dies meanwhile
    finally:
        await deployment.stop()                    # SIGTERM, then SIGKILL; the databases dropped

Each replica gets its own folder (its cwd, HOME, TMPDIR and ROUNDTRIP_STATE_DIR), its own HOSTNAME (and
in k8s the kubelet's KUBERNETES_SERVICE_* variables) and its own local port for every port setting in its
environment. What is replaced, by variable:

    ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS    the session's broker
    ROUNDTRIP_*_DATABASE_URL             a database of the session's PostgreSQL, one per database the manifest
                                         names and run (same driver: postgresql+asyncpg stays so), with the
                                         manifest's login: the one of the URL `roundtrip db upgrade` runs with
                                         is made and given the database (with CREATEROLE), as its operator does
                                         once; the others are the manifest's own steps' to make
    ROUNDTRIP_OTLP_ENDPOINT              the session's OTLP receiver
    ROUNDTRIP_CONSOLE_JAEGER_URL         a loopback Jaeger UI (a link for people's browsers, not an address)
    ROUNDTRIP_CONSOLE_OIDC_ISSUER        kept: the company's sign-on is no workload of the manifest; the test
                                         fills it with its own issuer's loopback URL, as the operator fills it
    ROUNDTRIP_*_PORT                     this replica's own local port
    ROUNDTRIP_LISTEN_HOST                127.0.0.1
    ROUNDTRIP_STATE_DIR                  this replica's folder
    ROUNDTRIP_TOPIC_PREFIX               the run's own (the broker is shared with other tests)
    ROUNDTRIP_REPLICATION_FACTOR,        1: the session's broker is one node (not an address: the one
    ROUNDTRIP_MIN_INSYNC_REPLICAS        substitution of another kind)
    any other URL                        the local process of the workload its host and port name
    a path a volume mounts (k8s)         the file written in the replica's folder (mounts/<path>), its text
                                         the manifest's Secret or ConfigMap (a Kafka CA, say)

A URL left pointing anywhere but loopback raises DeployError before anything starts. `roundtrip` in a
command is the entry point of this virtualenv (next to sys.executable).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
from sqlalchemy.engine import make_url

from roundtrip._broker.embedded import die_with_parent_preexec, free_port
from tests.e2e.manifest_workloads import Container, Manifest, Workload
from tests.manifests import files_here

T = TypeVar("T")
SINGLE_BROKER = {"ROUNDTRIP_REPLICATION_FACTOR": "1", "ROUNDTRIP_MIN_INSYNC_REPLICAS": "1"}
TAIL_LINES = 25


class DeployError(RuntimeError):
    pass


@dataclass
class LocalWorld:
    """The session's real parts that stand in for the cluster's, and the run's own names on them."""

    kafka_bootstrap: str
    postgres_url: str
    otlp_endpoint: str
    tag: str  # unique per run: the topic prefix and the database names carry it
    databases: dict[str, str] = field(default_factory=dict)  # manifest database -> the run's

    @property
    def topic_prefix(self) -> str:
        return f"{self.tag}."

    def database_url(self, url: str) -> str:
        """The manifest's URL with the session's server and the run's database, in the manifest's form."""
        manifest, session = make_url(url), make_url(self.postgres_url)
        name = self.databases.setdefault(manifest.database, f"{manifest.database}_{self.tag}")
        local = manifest.set(host=session.host, port=session.port, database=name)
        return local.render_as_string(hide_password=False)

    async def _each_database(self, statement: str) -> None:
        for name in self.databases.values():
            await self._each(statement.format(name=name))

    async def _each(self, statement: str) -> None:
        connection = await asyncpg.connect(
            make_url(self.postgres_url).set(drivername="postgresql").render_as_string(hide_password=False)
        )
        try:
            await connection.execute(statement)
        finally:
            await connection.close()

    async def create_databases(self, owners: dict[str, str] | None = None) -> None:
        """Each database, owned by `owners`' login for it (manifest database -> login) when one is named."""
        session = make_url(self.postgres_url).username
        for database, login in (owners or {}).items():
            if login != session and database in self.databases:
                await self._each(
                    f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{login}') THEN "
                    f'CREATE ROLE "{login}" LOGIN CREATEROLE; END IF; END $$'
                )
        for database, name in self.databases.items():
            owner = (owners or {}).get(database)
            await self._each(f'CREATE DATABASE "{name}"' + (f' OWNER "{owner}"' if owner else ""))

    async def drop_databases(self) -> None:
        await self._each_database('DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@dataclass
class Process:
    label: str  # "executor-2", "executor-2 init 1"
    popen: subprocess.Popen
    log: Path


@dataclass
class Replica:
    workload: Workload
    index: int
    folder: Path
    identity: dict[str, str]
    ports: dict[int, int] = field(default_factory=dict)  # manifest port -> this replica's local port
    envs: dict[int, dict[str, str]] = field(default_factory=dict)  # id(container) -> its environment, localized
    processes: list[Process] = field(default_factory=list)
    main: Process | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)  # ready (or, one-shot, exited 0)

    @property
    def label(self) -> str:
        return self.workload.name if self.workload.replicas == 1 else f"{self.workload.name}-{self.index + 1}"

    def address(self, port: int) -> str:
        """Where this replica listens on what the manifest calls `port`."""
        if port not in self.ports:
            raise DeployError(f"{self.label}: port {port} is not a port its environment makes it listen on")
        return f"127.0.0.1:{self.ports[port]}"

    def url(self, path: str, port: int) -> str:
        return f"http://{self.address(port)}{path}"


class LocalDeployment:
    def __init__(self, manifest: Manifest, world: LocalWorld, folder: Path) -> None:
        self.manifest, self.world, self.folder = manifest, world, folder
        taken: set[int] = set()

        def local_port() -> int:
            while (port := free_port()) in taken:
                pass
            taken.add(port)
            return port

        self.replicas: dict[str, list[Replica]] = {}
        for name, workload in manifest.workloads.items():
            self.replicas[name] = []
            for index in range(workload.replicas):
                replica = Replica(workload, index, folder / f"{name}-{index + 1}", manifest.identity(name, index))
                for container in (*workload.init, workload.main):
                    for variable, value in container.env.items():
                        if variable.endswith("_PORT") and value.isdigit() and int(value) not in replica.ports:
                            replica.ports[int(value)] = local_port()
                self.replicas[name].append(replica)
        # every environment is made before anything starts: an address the test cannot replace fails here
        for replica in self.all():
            for container in (*replica.workload.init, replica.workload.main):
                replica.envs[id(container)] = self._environment(replica, container)

    def all(self) -> list[Replica]:
        return [r for replicas in self.replicas.values() for r in replicas]

    # -- the environment ------------------------------------------------------------------------
    def _environment(self, replica: Replica, container: Container) -> dict[str, str]:
        tmp = replica.folder / "tmp"
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            "HOME": str(replica.folder),
            "TMPDIR": str(tmp),
            **replica.identity,
        }
        for variable, value in {
            "ROUNDTRIP_TOPIC_PREFIX": "",
            **container.env,
        }.items():  # a topic prefix of its own, always
            env[variable] = self._localize(replica, variable, value)
        for variable, value in env.items():
            if "://" in value and urlsplit(value).hostname not in ("127.0.0.1", None):
                raise DeployError(f"{replica.label}: {variable}={value} still points away from this machine")
        return files_here(env, container.files, replica.folder / "mounts")

    def _localize(self, replica: Replica, variable: str, value: str) -> str:
        if variable == "ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS":
            return self.world.kafka_bootstrap
        if variable.endswith("_DATABASE_URL") and value:
            return self.world.database_url(value)
        if variable == "ROUNDTRIP_OTLP_ENDPOINT" and value:
            return self.world.otlp_endpoint
        if variable == "ROUNDTRIP_CONSOLE_JAEGER_URL" and value:
            return "http://127.0.0.1:16686"  # a link the console's pages show people; no process calls it
        if variable == "ROUNDTRIP_CONSOLE_OIDC_ISSUER":
            return value  # loopback or refused below, like every URL
        if variable.endswith("_PORT") and value.isdigit():
            return str(replica.ports[int(value)])
        if variable == "ROUNDTRIP_LISTEN_HOST":
            return "127.0.0.1"
        if variable == "ROUNDTRIP_STATE_DIR":
            return str(replica.folder / "state")
        if variable == "ROUNDTRIP_TOPIC_PREFIX":
            return self.world.topic_prefix
        if variable in SINGLE_BROKER:
            return SINGLE_BROKER[variable]
        if "://" in value:
            return self._local_url(replica, variable, value)
        return value

    def _local_url(self, replica: Replica, variable: str, value: str) -> str:
        url = urlsplit(value)
        port = url.port or {"http": 80, "https": 443}.get(url.scheme)
        target = self.manifest.addresses.get((url.hostname, port))
        if target is None:
            raise DeployError(f"{replica.label}: {variable}={value} names no workload of the manifest")
        name, listens = target
        return urlunsplit(url._replace(netloc=self.replicas[name][0].address(listens)))

    # -- running --------------------------------------------------------------------------------
    def _spawn(self, replica: Replica, container: Container, label: str) -> Process:
        argv = list(container.argv)
        if argv[0] != "roundtrip":
            raise DeployError(f"{label}: the test runs `roundtrip ...` commands, not {argv}")
        argv[0] = str(Path(sys.executable).parent / "roundtrip")
        for folder in (replica.folder, replica.folder / "tmp"):
            folder.mkdir(parents=True, exist_ok=True)
        log = replica.folder / f"{label.replace(' ', '-')}.log"
        with open(log, "ab") as out:
            popen = subprocess.Popen(
                argv,
                cwd=replica.folder,
                env=replica.envs[id(container)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=die_with_parent_preexec(signal.SIGTERM),
            )
        process = Process(label, popen, log)
        replica.processes.append(process)
        return process

    async def _exit_code(self, process: Process) -> int:
        while process.popen.poll() is None:
            await asyncio.sleep(0.1)  # poll interval: the one-off container's process exiting
        return process.popen.returncode

    async def _run(self, replica: Replica, http: httpx.AsyncClient) -> None:
        for name, condition in replica.workload.after.items():
            if name in self.manifest.stand_ins:
                continue  # the session's broker and database are up before the test starts
            if condition not in ("service_started", "service_healthy", "service_completed_successfully"):
                raise DeployError(
                    f"{replica.label}: depends on {name} with a condition the test does not know: {condition}"
                )
            for other in self.replicas[name]:
                while condition == "service_started" and other.main is None:
                    await asyncio.sleep(0.1)  # poll interval: the service it depends on started
                if condition != "service_started":
                    await other.done.wait()
        for i, container in enumerate(replica.workload.init):
            process = self._spawn(replica, container, f"{replica.label} init {i + 1}")
            if code := await self._exit_code(process):
                raise DeployError(f"{process.label} ({' '.join(container.argv)}) exited with code {code}")
        replica.main = self._spawn(replica, replica.workload.main, replica.label)
        if replica.workload.one_shot:
            if code := await self._exit_code(replica.main):
                raise DeployError(f"{replica.label} ({' '.join(replica.workload.main.argv)}) exited with code {code}")
        elif replica.workload.main.ready:
            url = replica.url(*replica.workload.main.ready)
            while True:
                self.check_alive()
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get(url, timeout=2)).status_code == 200:
                        break
                await asyncio.sleep(0.2)  # poll interval: the health check answering
        replica.done.set()

    async def start(self, timeout: float) -> None:
        """Create the databases, then run every replica (init steps first) and wait until each is ready."""
        await self.world.create_databases(self._owners())
        async with httpx.AsyncClient() as http:
            runs = [asyncio.create_task(self._run(r, http)) for r in self.all()]
            try:
                done, pending = await asyncio.wait(runs, timeout=timeout, return_when=asyncio.FIRST_EXCEPTION)
                for task in done:
                    task.result()  # the first failure, with its reason
                if pending:
                    late = [r.label for r in self.all() if not r.done.is_set()]
                    raise DeployError(f"not ready within {timeout:g} s: {', '.join(late)}")
            finally:
                for task in runs:
                    task.cancel()
                await asyncio.gather(*runs, return_exceptions=True)

    def _owners(self) -> dict[str, str]:
        """Manifest database -> the login that migrates it (`roundtrip db upgrade`): its owner."""
        owners = {}
        for replica in self.all():
            for container in (*replica.workload.init, replica.workload.main):
                if list(container.argv[1:3]) == ["db", "upgrade"]:
                    for variable, value in container.env.items():
                        if variable.endswith("_DATABASE_URL") and value and make_url(value).username:
                            owners[make_url(value).database] = make_url(value).username
        return owners

    def check_alive(self) -> None:
        for replica in self.all():
            if replica.main and not replica.workload.one_shot and replica.main.popen.poll() is not None:
                raise DeployError(f"{replica.label} exited with code {replica.main.popen.returncode}")

    async def while_running(self, work: Awaitable[T]) -> T:
        """Await `work`, failing as soon as a service's process exits."""
        task = asyncio.ensure_future(work)
        try:
            while not task.done():
                self.check_alive()
                await asyncio.wait([task], timeout=0.5)
            return task.result()
        finally:
            task.cancel()

    async def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM every process still running, SIGKILL what is left after `grace_s`; drop the run's databases."""
        processes = [p for r in self.all() for p in r.processes if p.popen.poll() is None]
        for p in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while any(p.popen.poll() is None for p in processes) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)  # poll interval: the stopped processes exiting within the grace
        for p in processes:
            if p.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.popen.pid, signal.SIGKILL)
                p.popen.wait()
        with contextlib.suppress(OSError, asyncpg.PostgresError):
            await self.world.drop_databases()

    def tails(self) -> str:
        """The last lines of every process's log (for a failure's report)."""
        parts = []
        for replica in self.all():
            for p in replica.processes:
                lines = p.log.read_text(errors="replace").splitlines()[-TAIL_LINES:] if p.log.exists() else []
                parts.append(f"----- {p.label} (exit {p.popen.poll()}, {p.log}) -----\n" + "\n".join(lines))
        return "\n".join(parts)
