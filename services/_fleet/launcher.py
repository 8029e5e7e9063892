"""Starts, supervises and stops the fleet as separate processes: what `roundtrip up` runs.

Order: the fleet's databases brought to this code's revision, the embedded broker (unless bootstrap servers are
configured), the topics, the simulator (unless an API key is set), the demo shop (when the agent is the demo shop's
and names no shop URL of its own), then the five services and the console. Ports are checked before anything starts.
`Fleet` is the one object callers hold; what it does lives beside it in services/_fleet/.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from roundtrip._broker.embedded import EmbeddedKafka
from roundtrip._fleet import children as processes
from roundtrip._fleet import parts, readiness
from roundtrip._fleet import state as fleet_state
from roundtrip._fleet.parts import demo_shop
from roundtrip._fleet.supervisor import (
    Child,
    FleetError,
    RestartPolicy,
    claim_folder,
    release_folder,
    supervise,
)
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire import topology

START_TIMEOUT_S = 60.0  # the longest the services may take to say they are ready, restarts before it included


@dataclass
class Fleet:
    settings: Settings
    env: dict[str, str] = field(default_factory=dict)
    executor_replicas: int = 1
    versions: dict[str, dict[str, str]] = field(default_factory=dict)  # agent version -> its services' own settings
    say: Callable[[str], None] = lambda line: None
    children: list[Child] = field(default_factory=list)
    broker: EmbeddedKafka | None = None
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    start_attempts: int = 3  # restarts of a part that exits before it is ready, before start() gives up
    _kafka: Child | None = field(default=None, init=False, repr=False)
    _claimed: Path | None = field(default=None, init=False, repr=False)  # our RUNNING_FILE in the state folder
    _retries: readiness.Retries | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.logs = self.settings.state_dir / "logs"

    def start(self) -> None:
        s = self.settings
        self.logs.mkdir(parents=True, exist_ok=True)
        self._claimed = claim_folder(s.state_dir)
        # the children share this folder, so its SQLite file is the fleet's one ledger
        if s.ledger_database_url is None:
            self.env.setdefault("ROUNDTRIP_LEDGER_DATABASE_URL", s.ledger_db_url)
        fleet_state.record(s.state_dir, {**os.environ, **self.env})
        try:  # whatever fails, stop() undoes what started and releases the folder
            shop = demo_shop(s, self.env)
            parts.check_ports(s, shop)
            # a port can still be lost between that check and the part's bind: the part is restarted, then named
            self._retries = readiness.Retries(
                self.policy,
                lambda child: self._restart_child(child, ready_pipe=True),
                self.say,
                parts.port_settings(s, shop).get,
                self.start_attempts,
            )
            parts.upgrade_databases(s, self.say)
            if s.embedded_broker:
                self._start_broker()
            parts.create_topics(self.settings, self.say, tuple(self.versions))
            if parts.runs_simulator(s):
                self._start_http("simulator", f"http://127.0.0.1:{s.simulator_port}")
            if shop is not None:
                self._start_http("shop", shop.shop_base_url)
            for name in topology.names():
                for replica in range(self.executor_replicas if name == "executor" else 1):
                    label = name if replica == 0 else f"{name}-{replica + 1}"
                    self._spawn(label, processes.run_argv(name), parts.where(name, s))
            self._spawn_versions()
            self.say("  waiting for the services to say they are ready (each connects to Kafka, up to 60 s)")
            self._wait_services()
        except BaseException:
            self.stop()
            raise
        finally:
            self._retries = None  # from here on supervise() restarts what dies

    def stop(self) -> None:
        processes.stop(self.children)
        self.children.clear()
        if self.broker is not None:
            self.broker.stop()
            self.broker = None
            self._kafka = None
        if self._claimed is not None:
            fleet_state.forget(self.settings.state_dir)
            release_folder(self._claimed)
            self._claimed = None

    def __enter__(self) -> Fleet:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def kill(self, name: str) -> None:
        """SIGKILL every process of one service (a crash, on purpose: how the fleet recovers)."""
        processes.kill(processes.of_service(self.children, name))

    def respawn(self, *names: str) -> None:
        """Start killed services (all their replicas) again and wait until they run."""
        found = {id(c): c for name in names for c in processes.of_service(self.children, name)}
        dead = [c for c in found.values() if c.process.poll() is not None]
        if not dead:
            raise FleetError(f"{', '.join(names)} is not stopped")
        fleet_state.record(self.settings.state_dir, {**os.environ, **self.env})
        for child in dead:  # every one started before any is waited for: a wait fails on any child that is down
            self.children.remove(child)
            processes.close_ready(child)
            self._spawn(child.name, _argv(child), child.where, child.env)
        for child in dead:
            if child.name in ("simulator", "shop"):
                readiness.wait_http(f"{child.where}/health", child.name, self.children)
        self._wait_services(names={child.name for child in dead})

    def respawn_exited(self) -> None:
        """Start every killed process again (each service once, all its replicas) and wait until they run."""
        if exited := self.exited():
            self.respawn(*(c.name for c in exited))

    def exited(self) -> list[Child]:
        return [c for c in self.children if c.process.poll() is not None]

    def supervise(self, should_stop: Callable[[], bool]) -> None:
        """Keep every child running until `should_stop()`, the embedded broker too. Call it from the thread that
        started the fleet: the children get SIGTERM when that thread ends."""
        supervise(
            lambda: [*([self._kafka] if self._kafka is not None else []), *self.children],
            lambda child: self._restart_child(child, ready_pipe=False),  # readiness is waited for at start only
            should_stop,
            self.policy,
            self.say,
        )

    def _start_broker(self) -> None:
        self.broker, self.settings, tls_env = parts.start_broker(self.settings, self.logs, self.say)
        self.env.update(tls_env)
        assert self.broker.proc is not None
        self._kafka = Child("kafka", self.broker.proc, self.logs / "kafka.log", self.settings.bootstrap_servers)

    def _start_http(self, name: str, base_url: str) -> None:
        self._spawn(name, processes.run_argv(name), base_url)
        readiness.wait_http(f"{base_url}/health", name, self.children, retries=self._retries)

    def _spawn_versions(self) -> None:
        """Each agent version's own model, gate and executor (`model@v2`), beside the default version's."""
        for version, own in self.versions.items():
            for name in topology.versioned():
                group = topology.group(name, prefix=self.settings.topic_prefix, version=version)
                env = {**own, "ROUNDTRIP_AGENT_VERSION": version}
                self._spawn(f"{name}@{version}", processes.run_argv(name), f"consumer group {group}", env)

    def _spawn(self, name: str, argv: list[str], where: str, own: dict[str, str] | None = None) -> None:
        log_path = self.logs / f"{name}.log"
        log_start = _size(log_path)
        own = own or {}
        env = {**os.environ, **self.env, **own}
        process, ready_fd = processes.popen(argv, log_path, env, ready_pipe=_is_service(name))
        self.children.append(Child(name, process, log_path, where, ready_fd=ready_fd, log_start=log_start, env=own))
        self.say(f"  {name:<10} {where}  (pid {process.pid}, log {log_path})")

    def _restart_child(self, child: Child, ready_pipe: bool) -> None:
        """A new process for a dead child, as supervise() asks: the broker on its data dir (topics, offsets kept).
        With `ready_pipe` (while the fleet starts), a service gets a new pipe to say "ready" on."""
        if child is self._kafka and self.broker is not None:
            self.broker.start()
            assert self.broker.proc is not None
            child.process = self.broker.proc
        else:
            processes.close_ready(child)
            child.log_start = _size(child.log_path)
            child.process, child.ready_fd = processes.popen(
                _argv(child),
                child.log_path,
                {**os.environ, **self.env, **child.env},
                ready_pipe and _is_service(child.name),
            )

    def _wait_services(self, names: set[str] | None = None) -> None:
        readiness.wait_services(self.children, START_TIMEOUT_S, names, self._retries)


def _is_service(name: str) -> bool:
    """A service, a replica or an agent version's: it says "ready" on a pipe (the simulator and shop serve HTTP)."""
    return name.split("-")[0].split("@")[0] in topology.names()


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _argv(child: Child) -> list[str]:
    """The command line a child was started with (the fleet starts each with a list of arguments)."""
    args = child.process.args
    assert isinstance(args, list)
    return [os.fsdecode(arg) for arg in args]
