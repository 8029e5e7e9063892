"""Starts and stops the fleet as separate processes: what `roundtrip up` and the e2e tests run.

Order: the embedded broker (unless bootstrap servers are configured), the topics, the
simulator (unless an API key is set), the shop, then the five services. Each child's
output goes to state_dir/logs/<name>.log. Ports are checked before anything starts.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from services.broker.embedded import die_with_parent_preexec
from services.kernel.settings import Settings

SERVICES = ("gateway", "model", "guard", "gate", "executor")


class FleetError(RuntimeError):
    pass


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


@dataclass
class Child:
    name: str
    process: subprocess.Popen
    log_path: Path
    where: str = ""


@dataclass
class Fleet:
    settings: Settings
    env: dict[str, str] = field(default_factory=dict)
    executor_replicas: int = 1
    say: Callable[[str], None] = lambda line: None
    children: list[Child] = field(default_factory=list)
    broker: object | None = None

    # -- lifecycle ------------------------------------------------------------------
    def start(self) -> None:
        s = self.settings
        self.logs = s.state_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self._check_ports()
        try:
            if s.embedded_broker:
                self._start_broker()
            self._create_topics()
            if s.use_simulator and not s.anthropic_base_url:
                self._spawn("simulator", [sys.executable, "-m", "services.cli", "run", "simulator"], f"http://127.0.0.1:{s.simulator_port}")
                self._wait_http(f"http://127.0.0.1:{s.simulator_port}/health", "simulator")
            if not s.shop_url:
                self._spawn("shop", [sys.executable, "-m", "services.cli", "run", "shop"], s.shop_base_url)
                self._wait_http(f"{s.shop_base_url}/health", "shop")
            for name in SERVICES:
                for replica in range(self.executor_replicas if name == "executor" else 1):
                    label = name if replica == 0 else f"{name}-{replica + 1}"
                    self._spawn(label, [sys.executable, "-m", "services.cli", "run", name], f"consumer group roundtrip-{name}")
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
        self.children.clear()
        if self.broker is not None:
            self.broker.stop()
            self.broker = None

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
        since = {}
        for child in dead:
            self.children.remove(child)
            since[child.name] = child.log_path.stat().st_size if child.log_path.exists() else 0
            self._spawn(child.name, list(child.process.args), child.where)
            if child.name in ("simulator", "shop"):
                self._wait_http(f"{child.where}/health", child.name)
        self._wait_services(names=set(since), since=since)

    def restart(self, name: str, env: dict[str, str] | None = None) -> None:
        self.kill(name)
        self.respawn(name, env)

    def exited(self) -> list[Child]:
        return [c for c in self.children if c.process.poll() is not None]

    # -- steps ----------------------------------------------------------------------
    def _check_ports(self) -> None:
        s = self.settings
        wanted = []
        if s.embedded_broker:
            wanted += [("embedded Kafka", s.kafka_port, "ROUNDTRIP_KAFKA_PORT"), ("Kafka controller", s.kafka_controller_port, "ROUNDTRIP_KAFKA_CONTROLLER_PORT")]
        if s.use_simulator and not s.anthropic_base_url:
            wanted.append(("simulator", s.simulator_port, "ROUNDTRIP_SIMULATOR_PORT"))
        if not s.shop_url:
            wanted.append(("shop", s.shop_port, "ROUNDTRIP_SHOP_PORT"))
        taken = [f"port {port} ({what}) is already in use; stop what holds it or set {var}" for what, port, var in wanted if not port_is_free(port)]
        if taken:
            raise FleetError("cannot start the fleet: " + "; ".join(taken))

    def _start_broker(self) -> None:
        from services.broker.embedded import EmbeddedKafka, fetch_kafka

        s = self.settings
        fetch_kafka(s.kafka_version, progress=self.say)
        self.broker = EmbeddedKafka(
            data_dir=s.state_dir / "kafka",
            port=s.kafka_port,
            controller_port=s.kafka_controller_port,
            version=s.kafka_version,
            log_file=self.logs / "kafka.log",
            die_with_parent=True,
        )
        self.broker.start()
        self.broker.wait_ready(60)
        self.say(f"  kafka      {s.bootstrap_servers}  (Apache Kafka {s.kafka_version}, KRaft; log {self.logs / 'kafka.log'})")

    def _create_topics(self) -> None:
        from services.kernel.admin import ensure_topics

        s = self.settings
        report = asyncio.run(
            ensure_topics(s.bootstrap_servers, s.topic_prefix, s.partitions, s.executor_partitions, s.replication_factor)
        )
        self.say(f"  {report}")

    def _spawn(self, name: str, argv: list[str], where: str) -> None:
        log_path = self.logs / f"{name}.log"
        out = open(log_path, "ab")  # noqa: SIM115 - handed to the child
        # a stable identity per replica (not the pid): a restarted gateway fences its predecessor's transaction at once
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1", "ROUNDTRIP_INSTANCE_ID": f"{socket.gethostname()}-{name}"}
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            preexec_fn=die_with_parent_preexec(),  # a killed `roundtrip up` leaves no orphans behind
        )
        out.close()
        self.children.append(Child(name, process, log_path, where))
        self.say(f"  {name:<10} {where}  (pid {process.pid}, log {log_path})")

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

    def _wait_services(self, timeout: float = 60, names: set[str] | None = None, since: dict[str, int] | None = None) -> None:
        """A service is ready when it logs that it started (after `since` bytes of its log)."""
        deadline = time.monotonic() + timeout
        pending = {c.name: c for c in self.children if c.name.split("-")[0] in SERVICES and (names is None or c.name in names)}
        since = since or {}
        while pending and time.monotonic() < deadline:
            self._check_alive()
            for name, child in list(pending.items()):
                if b" started (broker" in child.log_path.read_bytes()[since.get(name, 0):]:
                    del pending[name]
            time.sleep(0.1)
        if pending:
            raise FleetError(f"services did not start within {timeout:g} s: {', '.join(pending)}")

    def _check_alive(self) -> None:
        for child in self.exited():
            tail = child.log_path.read_text(errors="replace").splitlines()[-20:]
            raise FleetError(f"{child.name} exited with code {child.process.returncode}:\n" + "\n".join(tail))
