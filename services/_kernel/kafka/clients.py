"""The one place every Kafka client of the fleet is built, with the security the settings give. A bootstrap string
stands for PLAINTEXT clients of a local broker. Building a client does not connect; only starting it does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from roundtrip._kernel.kafka.security import broker_options, client_options
from roundtrip._kernel.settings import Settings


@dataclass(frozen=True)
class KafkaClients:
    bootstrap: str  # h1:9092,h2:9092
    security: dict[str, Any] = field(default_factory=dict, repr=False)  # repr=False: it holds the password

    @property
    def bootstrap_list(self) -> list[str]:
        return self.bootstrap.split(",")

    @property
    def broker_options(self) -> dict[str, Any]:
        return broker_options(self.security)

    def producer(self, **options: Any) -> AIOKafkaProducer:
        return AIOKafkaProducer(bootstrap_servers=self.bootstrap, **self.security, **options)

    def consumer(self, *topics: str, **options: Any) -> AIOKafkaConsumer:
        return AIOKafkaConsumer(*topics, bootstrap_servers=self.bootstrap, **self.security, **options)

    def admin(self, **options: Any) -> AIOKafkaAdminClient:
        return AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, **self.security, **options)


def kafka_clients(settings: Settings) -> KafkaClients:
    """Clients of the brokers in effect (named, else the embedded broker's), with KafkaSecurity's options."""
    return KafkaClients(settings.bootstrap_servers, client_options(settings))


def clients_of(target: KafkaClients | str) -> KafkaClients:
    return target if isinstance(target, KafkaClients) else KafkaClients(target)
