"""The embedded parts of a local fleet and what comes before the services: the ports they need, the databases, the
embedded Apache Kafka, the topics, and the demo shop's settings when the fleet runs the shop."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from roundtrip._broker.embedded import EmbeddedKafka
from roundtrip._fleet.supervisor import FleetError
from roundtrip._kernel.settings import Deployment, ModelSettings, Settings, describe_invalid
from roundtrip._sdk.agent import AgentError, load_agent
from roundtrip._shop.agent.settings import ShopAgentSettings


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def runs_simulator(settings: ModelSettings) -> bool:
    return settings.use_simulator and not settings.anthropic_base_url


def demo_shop(settings: Deployment, env: dict[str, str]) -> ShopAgentSettings | None:
    """The demo shop's settings as the fleet's children read them, when the fleet runs the shop: the agent is the
    demo shop's and names no shop URL."""
    try:  # found, not checked: its checks read the children's environment (an MCP server's URL), each child runs them
        agent = load_agent(settings.agent, check=False)
    except AgentError as exc:
        raise FleetError(str(exc)) from None
    if not (isinstance(agent.settings, type) and issubclass(agent.settings, ShopAgentSettings)):
        return None
    prefix = "ROUNDTRIP_"
    try:
        values: dict[str, Any] = {k[len(prefix) :].lower(): v for k, v in env.items() if k.startswith(f"{prefix}SHOP_")}
        shop = agent.settings(**values)
    except ValidationError as exc:
        raise FleetError(f"the demo shop's settings: {describe_invalid(exc)}") from None
    return None if shop.shop_url else shop


def wanted_ports(settings: Settings, shop: ShopAgentSettings | None) -> list[tuple[str, int, str]]:
    """(what, port, its setting) of every port the embedded parts will listen on."""
    s, wanted = settings, []
    if s.embedded_broker:
        wanted += [
            ("embedded Kafka", s.kafka_port, "ROUNDTRIP_KAFKA_PORT"),
            ("Kafka controller", s.kafka_controller_port, "ROUNDTRIP_KAFKA_CONTROLLER_PORT"),
        ]
    if runs_simulator(s):
        wanted.append(("simulator", s.simulator_port, "ROUNDTRIP_SIMULATOR_PORT"))
    if shop is not None:
        wanted.append(("shop", shop.shop_port, "ROUNDTRIP_SHOP_PORT"))
    wanted.append(("console", s.console_port, "ROUNDTRIP_CONSOLE_PORT"))
    return wanted


def port_settings(settings: Settings, shop: ShopAgentSettings | None) -> dict[int, str]:
    """port -> the setting that moves it, for the ports a part of the fleet binds, the services' health ports too."""
    from roundtrip._kernel.observability.health import PORT_STRIDE, REPLICA_PORTS

    found: dict[int, str] = {}
    if settings.health_port:
        span = PORT_STRIDE * REPLICA_PORTS if settings.health_port_per_service else 1
        for port in range(settings.health_port, settings.health_port + span):
            found[port] = "ROUNDTRIP_HEALTH_PORT (up --health-port)"
    found.update({port: var for _, port, var in wanted_ports(settings, shop)})
    return found


def check_ports(settings: Settings, shop: ShopAgentSettings | None) -> None:
    """Every port the embedded parts will listen on is free, or FleetError names each taken one and its setting."""
    taken = [
        f"port {port} ({what}) is already in use; stop what holds it or set {var}"
        for what, port, var in wanted_ports(settings, shop)
        if not port_is_free(port)
    ]
    if taken:
        raise FleetError("cannot start the fleet: " + "; ".join(taken))


def where(service: str, settings: Settings) -> str:
    """What `roundtrip up` says a service is at: its consumer group, or the console's address (it consumes nothing)."""
    from roundtrip._kernel.wire import topology

    if topology.service(service).inputs:
        return f"consumer group {topology.group(service, prefix=settings.topic_prefix)}"
    return f"http://{settings.listen_host}:{settings.console_port}"


def upgrade_databases(settings: Settings, say: Callable[[str], None]) -> None:
    from roundtrip._kernel.migrations.schema import upgrade_databases as upgrade

    for line in upgrade(settings):
        say(f"  {line}")


def start_broker(
    settings: Settings, logs: Path, say: Callable[[str], None]
) -> tuple[EmbeddedKafka, Settings, dict[str, str]]:
    """Start the embedded broker and wait until it serves: (the broker, the settings its clients use, the
    environment the children need for it)."""
    from roundtrip._broker.embedded import EmbeddedKafka, fetch_configured

    s, env = settings, {}
    libs = fetch_configured(s, progress=say)
    options = dict(libs_dir=libs, log_file=logs / "kafka.log", die_with_parent=True)
    if s.kafka_secured:
        from roundtrip._broker.secured import embedded_as_configured

        broker, tls_settings = embedded_as_configured(s, s.state_dir / "kafka-secured", **options)
        s = s.model_copy(update=tls_settings)
        env = {f"ROUNDTRIP_{key.upper()}": str(value) for key, value in tls_settings.items()}
        for key, value in tls_settings.items():
            say(f"  kafka {s.kafka_security_protocol}: export ROUNDTRIP_{key.upper()}={value}")
    else:
        broker = EmbeddedKafka.of(s, s.state_dir / "kafka", **options)
    say(f"  waiting for Kafka to serve on {s.bootstrap_servers} (its JVM starting, up to 60 s)")
    try:
        broker.start()
        broker.wait_ready(60)
    except BaseException:  # a broker that started and never served is stopped here: the fleet never held it
        broker.stop()
        raise
    say(f"  kafka      {s.bootstrap_servers}  (Apache Kafka {s.kafka_version}, KRaft; log {logs / 'kafka.log'})")
    return broker, s, env


def create_topics(settings: Settings, say: Callable[[str], None], versions: tuple[str, ...]) -> None:
    from roundtrip._kernel.kafka.admin import ensure_topics
    from roundtrip._kernel.kafka.clients import kafka_clients

    s = settings
    report = asyncio.run(
        ensure_topics(
            kafka_clients(s),
            s.topic_prefix,
            s.partitions,
            s.executor_partitions,
            s.replication_factor,
            min_insync_replicas=s.min_insync_replicas,
            versions=versions,
        )
    )
    say(f"  {report}")
