"""The embedded broker: Apache Kafka itself, one node in KRaft mode, run as a Java subprocess.

Its jars are fetched once from Maven Central with `mvn` (the pom.xml beside it) into a cache folder, then every start
is a plain `java -cp 'libs/*' kafka.Kafka server.properties`. Its knobs are settings of the embedded defaults
(ROUNDTRIP_KAFKA_PORT, _VERSION, _JAVA_OPTS, ...), passed in by the caller: this module reads no settings itself.
`python -m roundtrip._broker.embedded [fetch|run]` does the same from a shell.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import contextlib
import errno
import os
import shlex
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

# the jars and the set-up errors live in jars.py; their names stay importable from here, where callers look
from roundtrip._broker.jars import (
    DEFAULT_POM as DEFAULT_POM,
)
from roundtrip._broker.jars import (
    BrokerError as BrokerError,
)
from roundtrip._broker.jars import (
    BrokerSetupError as BrokerSetupError,
)
from roundtrip._broker.jars import (
    BrokerStartError as BrokerStartError,
)
from roundtrip._broker.jars import (
    PortInUseError as PortInUseError,
)
from roundtrip._broker.jars import (
    fetch_configured as fetch_configured,
)
from roundtrip._broker.jars import (
    fetch_kafka as fetch_kafka,
)
from roundtrip._broker.jars import (
    find_java as find_java,
)
from roundtrip._broker.jars import (
    find_mvn as find_mvn,
)
from roundtrip._broker.jars import (
    is_fetched as is_fetched,
)
from roundtrip._broker.jars import (
    kafka_cache_dir as kafka_cache_dir,
)
from roundtrip._kernel.settings import EmbeddedDefaults

_DEFAULTS = EmbeddedDefaults.model_fields
PROBE_TIMEOUT_S = 2.0  # one metadata request to a local broker
DEFAULT_VERSION: str = _DEFAULTS["kafka_version"].default
DEFAULT_LOG_LEVEL: str = _DEFAULTS["kafka_log_level"].default
# Small on purpose: the embedded broker shares a laptop with the fleet.
DEFAULT_JAVA_OPTS = (
    "-Xms64m -Xmx512m -XX:+UseSerialGC -XX:MaxMetaspaceSize=128m -Xss512k "
    "-XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true"
)
# The format step is a short-lived JVM: quicker with only the C1 compiler.
FORMAT_JAVA_OPTS = "-Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xshare:auto"

_HERE = Path(__file__).resolve().parent
LOG4J2_CONFIG = _HERE / "log4j2.yaml"


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when a server could listen on host:port now (TIME_WAIT leftovers do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def free_port() -> int:
    """A port nobody listens on right now on 127.0.0.1 (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return cast(int, s.getsockname()[1])


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by the broker")
        buf += chunk
    return bytes(buf)


def probe_metadata(host: str, port: int) -> list[tuple[int, str, int]]:
    """Send a Kafka Metadata (v4, no topics) request; return the live brokers (id, host, port). A broker lists itself
    once it has caught up with the metadata log and is unfenced, i.e. ready for clients."""
    client_id = b"roundtrip-probe"
    header = struct.pack(">hhih", 3, 4, 1, len(client_id)) + client_id  # Metadata v4, corr id 1
    body = struct.pack(">i?", 0, False)  # topics: empty array (none); allow_auto_topic_creation
    request = header + body
    with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S) as sock:
        sock.settimeout(PROBE_TIMEOUT_S)
        sock.sendall(struct.pack(">i", len(request)) + request)
        (size,) = struct.unpack(">i", _recv_exact(sock, 4))
        data = _recv_exact(sock, size)
    corr, _throttle, n = struct.unpack_from(">iii", data, 0)
    if corr != 1:
        raise ConnectionError(f"unexpected correlation id {corr}")
    pos, brokers = 12, []
    for _ in range(n):
        node_id, hlen = struct.unpack_from(">ih", data, pos)
        pos += 6
        bhost = data[pos : pos + hlen].decode()
        pos += hlen
        (bport, rlen) = struct.unpack_from(">ih", data, pos)
        pos += 6 + max(rlen, 0)
        brokers.append((node_id, bhost, bport))
    return brokers


def _tail(path: Path | None) -> str:
    if not path or not path.exists():
        return "(no broker log)"
    with open(path, errors="replace") as f:
        return "".join(deque(f, maxlen=30)).rstrip() or "(broker log is empty)"


def random_cluster_id() -> str:
    """A Kafka cluster id (what `kafka-storage random-uuid` prints), without starting a JVM."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


class EmbeddedKafka:
    """One Apache Kafka node (broker + KRaft controller) in `data_dir`, as a subprocess; its data survives restarts
    (storage is formatted only when data_dir/data/meta.properties does not exist yet)."""

    def __init__(
        self,
        data_dir: Path | str,
        port: int = 9092,
        controller_port: int = 9093,
        version: str = DEFAULT_VERSION,
        log_file: Path | str | None = None,
        *,
        host: str = "127.0.0.1",
        libs_dir: Path | str | None = None,
        java_opts: str | None = None,
        log_level: str = DEFAULT_LOG_LEVEL,
        cache: Path | None = None,
        properties: Mapping[str, object] | None = None,
        die_with_parent: bool = False,
        format_args: Sequence[str] = (),
        probe: Callable[[], object] | None = None,
    ):
        self.data_dir = Path(data_dir).resolve()
        self.port = port
        self.controller_port = controller_port
        self.version = version
        self.host = host
        self.log_file = Path(log_file).resolve() if log_file else self.data_dir / "broker.log"
        self.libs_dir = Path(libs_dir) if libs_dir else None
        self.java_opts = java_opts if java_opts is not None else DEFAULT_JAVA_OPTS
        self.log_level, self.cache = log_level, cache
        self.extra_properties = dict(properties or {})
        # secured brokers: SCRAM users for `StorageTool format`; a secured port does not answer the plain probe
        self.format_args, self.probe = tuple(format_args), probe
        # Linux: the JVM gets SIGTERM when the thread that started it exits, so a killed caller leaves no orphan
        self.die_with_parent = die_with_parent
        self.proc: subprocess.Popen[bytes] | None = None
        self.formatted_on_start = False

    @classmethod
    def of(cls, settings: EmbeddedDefaults, data_dir: Path | str, **options: Any) -> EmbeddedKafka:
        """The broker the embedded defaults describe: their ports, version, JVM options, log level and jar cache."""
        return cls(
            data_dir,
            settings.kafka_port,
            settings.kafka_controller_port,
            settings.kafka_version,
            java_opts=settings.kafka_java_opts or None,
            log_level=settings.kafka_log_level,
            cache=settings.kafka_cache,
            **options,
        )

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def properties_file(self) -> Path:
        return self.data_dir / "server.properties"

    @property
    def log_dirs(self) -> Path:
        return self.data_dir / "data"

    @property
    def is_formatted(self) -> bool:
        return (self.log_dirs / "meta.properties").is_file()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def server_properties(self) -> dict[str, object]:
        h, p, c = self.host, self.port, self.controller_port
        props: dict[str, object] = {
            "process.roles": "broker,controller",
            "node.id": 1,
            "controller.quorum.voters": f"1@{h}:{c}",
            "listeners": f"PLAINTEXT://{h}:{p},CONTROLLER://{h}:{c}",
            "advertised.listeners": f"PLAINTEXT://{h}:{p}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.log_dirs),
            "num.partitions": 1,
            "default.replication.factor": 1,
            "min.insync.replicas": 1,
            "offsets.topic.replication.factor": 1,
            "offsets.topic.num.partitions": 10,
            "transaction.state.log.replication.factor": 1,
            "transaction.state.log.min.isr": 1,
            "transaction.state.log.num.partitions": 10,
            "share.coordinator.state.topic.replication.factor": 1,
            "share.coordinator.state.topic.min.isr": 1,
            "group.initial.rebalance.delay.ms": 0,
            "num.network.threads": 2,
            "num.io.threads": 4,
            "num.recovery.threads.per.data.dir": 1,
            "log.retention.hours": 168,
            "log.segment.bytes": 64 * 1024 * 1024,
        }
        props.update(self.extra_properties)
        return props

    def write_properties(self) -> Path:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        text = "# written by services/_broker/embedded.py on every start\n"
        text += "".join(f"{k}={v}\n" for k, v in self.server_properties().items())
        self.properties_file.write_text(text)
        return self.properties_file

    def _java_cmd(self, java_opts: str, main_class: str, *args: str) -> list[str]:
        assert self.libs_dir is not None
        return [
            find_java(),
            *shlex.split(java_opts),
            f"-Dlog4j2.configurationFile={LOG4J2_CONFIG}",
            f"-Droundtrip.kafka.log.level={self.log_level}",
            "-cp",
            str(self.libs_dir / "*"),
            main_class,
            *args,
        ]

    def format_storage(self, cluster_id: str | None = None) -> None:
        """Format log.dirs with `cluster_id` (a cluster's nodes share it) or a fresh one (kafka-storage format)."""
        cmd = self._java_cmd(
            FORMAT_JAVA_OPTS, "kafka.tools.StorageTool",
            "format", "-t", cluster_id or random_cluster_id(), "-c", str(self.properties_file), *self.format_args,
        )  # fmt: skip
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0 or not self.is_formatted:
            raise BrokerStartError(
                f"formatting Kafka storage in {self.log_dirs} failed (exit {proc.returncode}):\n"
                + (proc.stdout + proc.stderr).strip()
            )

    def check_ports(self) -> None:
        for port, what in ((self.port, "client listener"), (self.controller_port, "KRaft controller")):
            if not port_is_free(port, self.host):
                raise PortInUseError(
                    f"cannot start the embedded Kafka broker: port {port} ({what}) on {self.host} is "
                    "already in use. Is another broker (or `roundtrip up`) running? Stop it, or choose "
                    "other ports (ROUNDTRIP_KAFKA_PORT / ROUNDTRIP_KAFKA_CONTROLLER_PORT)."
                )

    def start(self) -> EmbeddedKafka:
        """Launch the broker (non-blocking; call wait_ready). Fetches the jars when needed."""
        if self.running():
            return self
        if self.port == self.controller_port:
            raise BrokerError("the client port and the controller port must differ")
        self.check_ports()
        if self.libs_dir is None:
            self.libs_dir = fetch_kafka(self.version, cache=self.cache)
        self.write_properties()
        self.formatted_on_start = False
        if not self.is_formatted:
            self.format_storage()
            self.formatted_on_start = True
        cmd = self._java_cmd(self.java_opts, "kafka.Kafka", str(self.properties_file))
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as log:
            log.write(f"\n---- roundtrip: starting Kafka {self.version} on {self.bootstrap} ----\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                start_new_session=True,  # its own process group: signals to us do not hit it
                preexec_fn=die_with_parent_preexec(signal.SIGTERM) if self.die_with_parent else None,
            )
        atexit.register(self._stop_at_exit)  # never leave a JVM behind when the Python process exits normally
        return self

    def wait_ready(self, timeout: float) -> EmbeddedKafka:
        """Block until the broker answers a metadata request listing itself."""
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        while True:
            if self.proc is None:
                raise BrokerStartError("the broker was not started")
            code = self.proc.poll()
            if code is not None:
                raise BrokerStartError(
                    f"the embedded Kafka broker exited with code {code} during start-up; "
                    f"last lines of {self.log_file}:\n{_tail(self.log_file)}"
                )
            try:
                if self.probe() if self.probe else probe_metadata(self.host, self.port):
                    return self
                last_error = BrokerError("no live broker in the metadata response yet")
            except (OSError, struct.error, UnicodeDecodeError) as e:
                last_error = e
            if time.monotonic() >= deadline:
                raise BrokerStartError(
                    f"the embedded Kafka broker on {self.bootstrap} was not ready after {timeout:.0f}s "
                    f"({last_error}); last lines of {self.log_file}:\n{_tail(self.log_file)}"
                )
            time.sleep(0.1)

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM (Kafka's clean shutdown), then SIGKILL after `timeout`; the exit code (the JVM's 143 after our
        SIGTERM counts as 0), -9 when it had to be killed, None when it was not running."""
        proc, self.proc = self.proc, None
        atexit.unregister(self._stop_at_exit)
        if proc is None:
            return None
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return proc.returncode
            return 0 if proc.returncode in (0, 128 + signal.SIGTERM, -signal.SIGTERM) else proc.returncode
        return proc.returncode

    def _stop_at_exit(self) -> None:
        with contextlib.suppress(Exception):
            self.stop(timeout=5)

    def __enter__(self) -> EmbeddedKafka:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.running() else "stopped"
        return f"<EmbeddedKafka {self.bootstrap} {state} data={self.data_dir}>"


def die_with_parent_preexec(sig: int) -> Callable[[], None] | None:
    """A Popen preexec_fn making the child get `sig` when the thread that started it exits (Linux; None elsewhere).
    libc is loaded here, in the parent, so the child only makes one system call between fork and exec."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, sig)

    return preexec


def main(argv: list[str] | None = None) -> int:
    """Fetch the jars, or run the broker in the foreground until SIGINT/SIGTERM."""
    from roundtrip._kernel.settings import Settings

    settings = Settings()  # an entry point: the one place this module reads the environment
    parser = argparse.ArgumentParser(prog="python -m roundtrip._broker.embedded", description=main.__doc__)
    parser.add_argument("command", nargs="?", choices=("run", "fetch"), default="run")
    parser.add_argument("--fetch-only", action="store_true", help="same as the `fetch` command")
    parser.add_argument("--data-dir", type=Path, default=settings.state_dir / "kafka")
    parser.add_argument("--port", type=int, default=settings.kafka_port)
    parser.add_argument("--controller-port", type=int, default=settings.kafka_controller_port)
    parser.add_argument("--version", default=settings.kafka_version)
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds to wait for readiness")
    args = parser.parse_args(argv)

    try:
        configured = settings.model_copy(
            update={
                "kafka_port": args.port,
                "kafka_controller_port": args.controller_port,
                "kafka_version": args.version,
            }
        )
        libs = fetch_configured(configured)
        if args.command == "fetch" or args.fetch_only:
            print(f"Kafka {args.version} jars: {libs}")
            return 0
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        kafka = EmbeddedKafka.of(configured, args.data_dir, libs_dir=libs)
        started = time.monotonic()
        with kafka:
            kafka.wait_ready(args.timeout)
            print(
                f"Kafka {args.version} listening on {kafka.bootstrap} (controller "
                f"{kafka.host}:{kafka.controller_port}), "
                f"ready in {time.monotonic() - started:.1f}s; data {kafka.log_dirs}; log {kafka.log_file}. "
                "Ctrl-C stops it.",
                flush=True,
            )
            while not stop.is_set():
                if not kafka.running():
                    print(
                        f"the broker exited unexpectedly; last lines of {kafka.log_file}:\n{_tail(kafka.log_file)}",
                        file=sys.stderr,
                    )
                    return 1
                stop.wait(0.5)
            print("stopping Kafka...", flush=True)
        print("Kafka stopped.")
        return 0
    except BrokerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
