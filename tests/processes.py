"""Processes tests start: an Apache Kafka broker (or a cluster) of their own, a service as `roundtrip up` does."""

from __future__ import annotations

import os
import select
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from roundtrip._broker.cluster import Cluster
from roundtrip._broker.cluster import start as start_cluster
from roundtrip._broker.embedded import EmbeddedKafka, fetch_configured, free_port
from roundtrip._fleet.launcher import Fleet
from roundtrip._kernel.runtime import READY_FD_ENV
from roundtrip._kernel.settings import Settings


@contextmanager
def embedded_kafka(data_dir: Path) -> Iterator[EmbeddedKafka]:
    """A one-node Apache Kafka (KRaft) on free ports, data in `data_dir`, ready; stopped at the end."""
    defaults, libs = _embedded_defaults()
    port = free_port()
    while (controller := free_port()) == port:
        pass
    kafka = EmbeddedKafka.of(
        defaults.model_copy(update={"kafka_port": port, "kafka_controller_port": controller}),
        data_dir,
        libs_dir=libs,
        die_with_parent=True,
    )
    with kafka:  # started, and stopped at the end
        kafka.wait_ready(120)
        yield kafka


@contextmanager
def embedded_cluster(data_dir: Path, n: int = 3) -> Iterator[Cluster]:
    """n Apache Kafka nodes (KRaft) on free ports, data in data_dir/node-<id>, all serving clients; stopped after."""
    defaults, libs = _embedded_defaults()
    with start_cluster(
        data_dir,
        n,
        libs_dir=libs,
        version=defaults.kafka_version,
        log_level=defaults.kafka_log_level,
        die_with_parent=True,
    ) as cluster:
        yield cluster


def _embedded_defaults() -> tuple[Settings, Path]:
    """The environment's embedded defaults (version, JVM options, log level, jar cache) and the fetched jars."""
    defaults = Settings()
    return defaults, fetch_configured(
        defaults, progress=lambda line: print(line, file=sys.__stderr__, flush=True)
    )  # cached: a no-op once fetched


def start_service(name: str, env: dict[str, str], log: Path) -> subprocess.Popen:
    """`roundtrip run NAME`, returned once it has said it started (the ready pipe `roundtrip up` uses)."""
    read_fd, write_fd = os.pipe()
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "roundtrip._cli.main", "run", name],
            env={**env, READY_FD_ENV: str(write_fd)},
            stdout=out,
            stderr=subprocess.STDOUT,
            pass_fds=(write_fd,),
            start_new_session=True,
        )
    os.close(write_fd)
    try:
        readable, _, _ = select.select([read_fd], [], [], 90)
        said = os.read(read_fd, 64) if readable else b""
    finally:
        os.close(read_fd)
    assert said.startswith(b"ready"), f"{name} did not start:\n{log.read_text()[-3000:]}"
    return proc


def restart(fleet: Fleet, name: str, env: dict[str, str] | None = None) -> None:
    """Kill one service of a running fleet and start it again, with `env` added to the fleet's settings from then on."""
    fleet.kill(name)
    if env:
        fleet.env = {**fleet.env, **env}
    fleet.respawn(name)
