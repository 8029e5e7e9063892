"""The one place every Kafka client of the fleet is built: producers, consumers, admin clients and FastStream's
broker, all with the security the settings give (services/_kernel/kafka/security.py).

    kafka = kafka_clients(settings)          # the settings' bootstrap servers and security
    kafka.producer(transactional_id=...)     # AIOKafkaProducer
    kafka.consumer(enable_auto_commit=False) # AIOKafkaConsumer
    kafka.admin(client_id="roundtrip-admin") # AIOKafkaAdminClient
    KafkaBroker(kafka.bootstrap_list, **kafka.broker_options, ...)

`clients_of(target)` takes a KafkaClients or a bootstrap string (PLAINTEXT at that address: a local broker).
Building a client does not connect; only starting it does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from roundtrip._kernel.kafka.security import broker_options, client_options
from roundtrip._kernel.settings import KafkaSecurity


@dataclass(frozen=True)
class KafkaClients:
    """A cluster's address and how to connect to it: every client of the fleet is made here."""

    bootstrap: str  # h1:9092,h2:9092
    security: dict[str, Any] = field(default_factory=dict, repr=False)  # aiokafka's security arguments; {} PLAINTEXT

    @property
    def bootstrap_list(self) -> list[str]:
        return self.bootstrap.split(",")

    @property
    def broker_options(self) -> dict[str, Any]:
        """FastStream's KafkaBroker security arguments (`security`, and the OAUTHBEARER token provider)."""
        return broker_options(self.security)

    def producer(self, **options: Any) -> AIOKafkaProducer:
        return AIOKafkaProducer(bootstrap_servers=self.bootstrap, **self.security, **options)

    def consumer(self, *topics: str, **options: Any) -> AIOKafkaConsumer:
        return AIOKafkaConsumer(*topics, bootstrap_servers=self.bootstrap, **self.security, **options)

    def admin(self, **options: Any) -> AIOKafkaAdminClient:
        return AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, **self.security, **options)


def kafka_clients(settings: Any) -> KafkaClients:
    """The clients of a fleet's settings (a Settings: its bootstrap servers and its KafkaSecurity)."""
    security: KafkaSecurity = settings
    return KafkaClients(settings.bootstrap_servers, client_options(security))


def clients_of(target: KafkaClients | str) -> KafkaClients:
    """A KafkaClients as is; a bootstrap string as PLAINTEXT clients of that address."""
    return target if isinstance(target, KafkaClients) else KafkaClients(target)
