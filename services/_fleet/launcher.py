"""Starts, supervises and stops the fleet as separate processes: what `roundtrip up` and the e2e tests run.

Order: the fleet's databases brought to this code's revision (`roundtrip db upgrade`), the
embedded broker (unless bootstrap servers are configured), the topics, the simulator (unless an
API key is set), the demo shop (when the agent is the demo shop's and names no shop URL of its own:
`demo_shop()`), then the five services. Each child's
output goes to state_dir/logs/<name>.log. Ports are checked before anything starts.

A service is ready when it says so: each is started with the write end of a pipe
(`ROUNDTRIP_READY_FD`, services/_kernel/runtime.py) and writes one line to it once it has
started, whatever its log level; an earlier run's log can never count.

`Fleet.supervise` (what `roundtrip up` does once everything runs) restarts any child that
dies, the embedded broker included (same data dir), with exponential backoff
(`RestartPolicy`, services/_fleet/supervisor.py), reporting each death and restart, until it is told to stop. It sleeps
in select() on the children's pidfds, so a death is seen at once without polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from pydantic import ValidationError

from roundtrip._fleet import state as fleet_state
from roundtrip._broker.embedded import die_with_parent_preexec
from roundtrip._kernel.wire import topology
from roundtrip._kernel.runtime import READY_FD_ENV
from roundtrip._kernel.settings import Settings, describe_invalid
from roundtrip._shop.agent.settings import ShopAgentSettings
from roundtrip._sdk.agent import AgentError, load_agent
from roundtrip._fleet.supervisor import (  # FleetError: what `roundtrip up` prints, from here as ever
    Child, FleetError, RestartPolicy, claim_folder, describe_exit, release_folder, signal_wakeup,
)


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def demo_shop(settings: Settings, env: dict[str, str]) -> ShopAgentSettings | None:
    """The demo shop's settings as the fleet's children read them (`env` over this process's), when the agent the
    fleet runs is the demo shop's (its settings are ShopAgentSettings) and names no shop URL: the fleet runs the shop."""
    try:  # found, not checked: its checks read the children's environment (an MCP server's URL), each child runs them
        agent = load_agent(settings.agent, check=False)
    except AgentError as exc:
        raise FleetError(str(exc)) from None
    if not (isinstance(agent.settings, type) and issubclass(agent.settings, ShopAgentSettings)):
        return None
    prefix = "ROUNDTRIP_"
    try:
        shop = agent.settings(**{k[len(prefix):].lower(): v for k, v in env.items() if k.startswith(f"{prefix}SHOP_")})
    except ValidationError as exc:
        raise FleetError(f"the demo shop's settings: {describe_invalid(exc)}") from None
    return None if shop.shop_url else shop


@dataclass
class Fleet:
    settings: Settings
    env: dict[str, str] = field(default_factory=dict)
    executor_replicas: int = 1
    say: Callable[[str], None] = lambda line: None
    children: list[Child] = field(default_factory=list)
    broker: object | None = None
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    _kafka: Child | None = field(default=None, init=False, repr=False)  # the embedded broker's process, as supervise() sees it
    _claimed: Path | None = field(default=None, init=False, repr=False)  # our RUNNING_FILE in the state folder
    _shop: ShopAgentSettings | None = field(default=None, init=False, repr=False)  # the demo shop this fleet runs

    # -- lifecycle ------------------------------------------------------------------
    def start(self) -> None:
        s = self.settings
        self.logs = s.state_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self._claimed = claim_folder(s.state_dir)
        if s.ledger_database_url is None:  # the children share this folder, so its SQLite file is the fleet's one ledger
            self.env.setdefault("ROUNDTRIP_LEDGER_DATABASE_URL", s.ledger_db_url)
        fleet_state.record(s.state_dir, {**os.environ, **self.env})  # what the operator commands read (services/_fleet/state.py)
        try:  # whatever fails, stop() undoes what started and releases the folder
            self._shop = demo_shop(self.settings, self.env)
            self._check_ports()
            self._upgrade_databases()
            if s.embedded_broker:
                self._start_broker()
            self._create_topics()
            if s.use_simulator and not s.anthropic_base_url:
                self._spawn("simulator", [sys.executable, "-m", "roundtrip._cli.main", "run", "simulator"], f"http://127.0.0.1:{s.simulator_port}")
                self._wait_http(f"http://127.0.0.1:{s.simulator_port}/health", "simulator")
            if self._shop is not None:
                self._spawn("shop", [sys.executable, "-m", "roundtrip._cli.main", "run", "shop"], self._shop.shop_base_url)
                self._wait_http(f"{self._shop.shop_base_url}/health", "shop")
            for name in topology.names():
                for replica in range(self.executor_replicas if name == "executor" else 1):
                    label = name if replica == 0 else f"{name}-{replica + 1}"
                    self._spawn(label, [sys.executable, "-m", "roundtrip._cli.main", "run", name], f"consumer group {topology.group(name, prefix=s.topic_prefix)}")
            self._wait_services()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for child in reversed(self.children):
            if child.process.poll() is None:
                child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for child in reversed(self.children):
            try:
                child.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.process.kill()
                child.process.wait()
        for child in self.children:
            self._close_ready(child)
        self.children.clear()
        if self.broker is not None:
            self.broker.stop()
            self.broker = None
            self._kafka = None
        self._release_folder()

    def __enter__(self) -> Fleet:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def kill(self, name: str) -> None:
        """SIGKILL every process of one service (tests of crash recovery)."""
        for child in self.children:
            if child.name == name or child.name.startswith(f"{name}-"):
                child.process.kill()
                child.process.wait()

    def respawn(self, name: str, env: dict[str, str] | None = None) -> None:
        """Start a killed service (all its replicas) again, optionally with changed settings, and wait until it runs."""
        dead = [c for c in self.children if (c.name == name or c.name.startswith(f"{name}-")) and c.process.poll() is not None]
        if not dead:
            raise FleetError(f"{name} is not stopped")
        if env:
            self.env = {**self.env, **env}
        fleet_state.record(self.settings.state_dir, {**os.environ, **self.env})  # the settings it now runs with
        for child in dead:
            self.children.remove(child)
            self._close_ready(child)
            self._spawn(child.name, list(child.process.args), child.where)
            if child.name in ("simulator", "shop"):
                self._wait_http(f"{child.where}/health", child.name)
        self._wait_services(names={child.name for child in dead})

    def restart(self, name: str, env: dict[str, str] | None = None) -> None:
        self.kill(name)
        self.respawn(name, env)

    def exited(self) -> list[Child]:
        return [c for c in self.children if c.process.poll() is not None]

    # -- supervision ------------------------------------------------------------------
    def supervise(self, should_stop: Callable[[], bool]) -> None:
        """Keep every child running until `should_stop()`: a child that dies (the embedded
        broker too) is reported and started again after its backoff delay; the others keep
        running. Blocks in select() on the children's pidfds (and, in the main thread, on a
        signal wake-up fd, so a signal handler that makes `should_stop()` true ends the wait at
        once); wakes at least every second. Call it from the thread that started the fleet: the
        children get SIGTERM when that thread ends (die_with_parent_preexec)."""
        wake_r, restore = signal_wakeup()
        pidfds: dict[int, int] = {}  # pid -> pidfd of the running children
        try:
            while not should_stop():
                now = time.monotonic()
                for child in self._supervised():
                    if child.restart_due is None and child.process.poll() is not None:
                        self._schedule_restart(child, now)
                    elif child.restart_due is not None and child.restart_due <= now:
                        self._restart(child, now)
                timeout = 1.0
                for child in self._supervised():
                    if child.restart_due is not None:
                        timeout = min(timeout, max(0.0, child.restart_due - time.monotonic()))
                live = {c.process.pid for c in self._supervised() if c.restart_due is None}
                for pid in set(pidfds) - live:
                    os.close(pidfds.pop(pid))
                for pid in live - set(pidfds):
                    with contextlib.suppress(AttributeError, OSError):  # no pidfd_open: the 1 s timeout does it
                        pidfds[pid] = os.pidfd_open(pid)
                readable, _, _ = select.select([*pidfds.values(), *([wake_r] if wake_r is not None else [])], [], [], timeout)
                if wake_r is not None and wake_r in readable:
                    with contextlib.suppress(BlockingIOError):
                        os.read(wake_r, 512)
        finally:
            for fd in pidfds.values():
                os.close(fd)
            restore()

    def _supervised(self) -> list[Child]:
        return [*([self._kafka] if self._kafka is not None else []), *self.children]

    def _schedule_restart(self, child: Child, now: float) -> None:
        uptime = now - child.started_at
        child.delay = self.policy.next_delay(child.delay, uptime)
        child.restart_due = now + child.delay
        self.say(
            f"roundtrip: {child.name} (pid {child.process.pid}) died: {describe_exit(child.process.returncode)} "
            f"after {uptime:.1f} s up; restarting in {child.delay:g} s (log {child.log_path})"
        )

    def _restart(self, child: Child, now: float) -> None:
        try:
            if child is self._kafka:
                self.broker.start()  # same data dir: the topics and offsets are kept
                child.process = self.broker.proc
            else:
                self._close_ready(child)
                child.process, _ = self._popen(list(child.process.args), child.log_path)
        except Exception as exc:  # noqa: BLE001 - a failed start is one more death to back off from
            child.started_at = now
            child.delay = self.policy.next_delay(child.delay, 0.0)
            child.restart_due = now + child.delay
            self.say(f"roundtrip: {child.name} could not be restarted ({exc}); trying again in {child.delay:g} s")
            return
        child.started_at, child.restart_due = now, None
        child.restarts += 1
        self.say(f"roundtrip: {child.name} restarted (pid {child.process.pid}, restart {child.restarts})")

    # -- steps ----------------------------------------------------------------------
    def _release_folder(self) -> None:
        if self._claimed is not None:
            fleet_state.forget(self.settings.state_dir)
            release_folder(self._claimed)
            self._claimed = None

    def _check_ports(self) -> None:
        s = self.settings
        wanted = []
        if s.embedded_broker:
            wanted += [("embedded Kafka", s.kafka_port, "ROUNDTRIP_KAFKA_PORT"), ("Kafka controller", s.kafka_controller_port, "ROUNDTRIP_KAFKA_CONTROLLER_PORT")]
        if s.use_simulator and not s.anthropic_base_url:
            wanted.append(("simulator", s.simulator_port, "ROUNDTRIP_SIMULATOR_PORT"))
        if self._shop is not None:
            wanted.append(("shop", self._shop.shop_port, "ROUNDTRIP_SHOP_PORT"))
        taken = [f"port {port} ({what}) is already in use; stop what holds it or set {var}" for what, port, var in wanted if not port_is_free(port)]
        if taken:
            raise FleetError("cannot start the fleet: " + "; ".join(taken))

    def _start_broker(self) -> None:
        from roundtrip._broker.embedded import EmbeddedKafka, fetch_configured

        s = self.settings
        libs = fetch_configured(s, progress=self.say)
        options = dict(libs_dir=libs, log_file=self.logs / "kafka.log", die_with_parent=True)
        if s.kafka_secured:  # secured as the settings say; its clients get the throwaway CA (services/_broker/secured.py)
            from roundtrip._broker.secured import embedded_as_configured

            self.broker, tls_settings = embedded_as_configured(s, s.state_dir / "kafka-secured", **options)
            self.settings = s = s.model_copy(update=tls_settings)
            self.env.update({f"ROUNDTRIP_{key.upper()}": str(value) for key, value in tls_settings.items()})
            for key, value in tls_settings.items():  # what commands run from the user's shell need too
                self.say(f"  kafka {s.kafka_security_protocol}: export ROUNDTRIP_{key.upper()}={value}")
        else:
            self.broker = EmbeddedKafka.of(s, s.state_dir / "kafka", **options)
        self.broker.start()
        self.broker.wait_ready(60)
        self._kafka = Child("kafka", self.broker.proc, self.logs / "kafka.log", s.bootstrap_servers)
        self.say(f"  kafka      {s.bootstrap_servers}  (Apache Kafka {s.kafka_version}, KRaft; log {self.logs / 'kafka.log'})")

    def _upgrade_databases(self) -> None:
        from roundtrip._kernel.migrations.schema import upgrade_databases

        for line in upgrade_databases(self.settings):
            self.say(f"  {line}")

    def _create_topics(self) -> None:
        from roundtrip._kernel.kafka.admin import ensure_topics
        from roundtrip._kernel.kafka.clients import kafka_clients

        s = self.settings
        report = asyncio.run(
            ensure_topics(kafka_clients(s), s.topic_prefix, s.partitions, s.executor_partitions, s.replication_factor,
                          min_insync_replicas=s.min_insync_replicas)
        )
        self.say(f"  {report}")

    def _spawn(self, name: str, argv: list[str], where: str) -> None:
        log_path = self.logs / f"{name}.log"
        process, ready_fd = self._popen(argv, log_path, ready_pipe=name.split("-")[0] in topology.names())
        self.children.append(Child(name, process, log_path, where, ready_fd=ready_fd))
        self.say(f"  {name:<10} {where}  (pid {process.pid}, log {log_path})")

    def _popen(self, argv: list[str], log_path: Path, ready_pipe: bool = False) -> tuple[subprocess.Popen, int | None]:
        """Start one child; with `ready_pipe`, also the pipe it says "ready" on (its read end is returned)."""
        # a stable identity per replica (not the pid): a restarted gateway fences its predecessor's transaction at once
        identity = f"{socket.gethostname()}-{log_path.stem}"
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1", "ROUNDTRIP_INSTANCE_ID": identity}
        env.pop(READY_FD_ENV, None)
        read_fd = write_fd = None
        if ready_pipe:
            read_fd, write_fd = os.pipe()
            env[READY_FD_ENV] = str(write_fd)
        try:
            with open(log_path, "ab") as out:  # the child has its own copy of the fd
                process = subprocess.Popen(
                    argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                    pass_fds=() if write_fd is None else (write_fd,),
                    preexec_fn=die_with_parent_preexec(),  # a killed `roundtrip up` leaves no orphans behind
                )
        except BaseException:
            for fd in (read_fd, write_fd):
                if fd is not None:
                    os.close(fd)
            raise
        if write_fd is not None:
            os.close(write_fd)  # the child's copy is the only one: its exit ends the pipe
        return process, read_fd

    @staticmethod
    def _close_ready(child: Child) -> None:
        if child.ready_fd is not None:
            os.close(child.ready_fd)
            child.ready_fd = None

    def _wait_http(self, url: str, name: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                if httpx.get(url, timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise FleetError(f"{name} did not answer {url} within {timeout:g} s")

    def _wait_services(self, timeout: float = 60, names: set[str] | None = None) -> None:
        """Wait until every service (of `names`) has said "ready" on its pipe; a child that exits first is an error."""
        deadline = time.monotonic() + timeout
        pending = {c.ready_fd: c for c in self.children
                   if c.ready_fd is not None and (names is None or c.name in names)}
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise FleetError(f"services did not start within {timeout:g} s: "
                                 f"{', '.join(sorted(c.name for c in pending.values()))}")
            readable, _, _ = select.select(list(pending), [], [], min(left, 1.0))
            for fd in readable:
                child, said = pending.pop(fd), os.read(fd, 256)
                self._close_ready(child)
                if not said.startswith(b"ready"):  # the end of the pipe without a word: the child has exited (or is exiting)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        child.process.wait(timeout=10)
                    self._check_alive()
                    raise FleetError(f"{child.name} closed its ready pipe without saying it started (log {child.log_path})")
            self._check_alive()

    def _check_alive(self) -> None:
        for child in self.exited():
            tail = child.log_path.read_text(errors="replace").splitlines()[-20:]
            raise FleetError(f"{child.name} exited with code {child.process.returncode}:\n" + "\n".join(tail))
