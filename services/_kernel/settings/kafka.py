"""The Kafka concerns: where the brokers are and how topics are made (`KafkaSettings`), and how a client proves who it
is (`KafkaSecurity`: TLS, SASL)."""

from __future__ import annotations

from typing import Annotated

from pydantic import (
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from roundtrip._kernel.settings.base import SECRET, Concern, ExistingFile, _upper
from roundtrip._kernel.settings.checks import (
    SASL_MECHANISMS,
    SECURITY_PROTOCOLS,
    check_import_string,
    check_kafka_security,
    parse_bootstrap_servers,
)


class KafkaSettings(Concern):
    heading = "Kafka"

    kafka_bootstrap_servers: str | None = Field(
        None,
        description=(
            "Kafka bootstrap servers, `host:port[,host:port...]`; unset means the embedded broker on kafka_port"
        ),
    )
    topic_prefix: str = Field(
        "",
        description="Prefix of every topic name, consumer group and transactional id: "
        "fleets that share a cluster share nothing else",
    )
    partitions: int = Field(6, ge=1, description="Partitions per topic for `roundtrip topics create`")
    executor_partitions: int | None = Field(
        None, ge=1, description=("Partitions of the executor topic (defaults to `partitions`)")
    )
    replication_factor: int = Field(
        1,
        ge=1,
        description=("Replication factor of the topics `roundtrip topics create` makes (the shipped k8s ConfigMap: 3)"),
    )
    min_insync_replicas: int | None = Field(
        None,
        ge=1,
        description=(
            "`min.insync.replicas` of the topics `roundtrip topics create` makes (k8s ConfigMap: 2); unset: the "
            "broker's default"
        ),
    )
    max_in_flight: int = Field(
        500,
        ge=1,
        description=(
            "Messages each subscription of a service holds at once (one conversation at a time, many concurrently); at"
            " the limit it pauses fetching"
        ),
    )
    reply_memory_s: float = Field(
        3600.0,
        gt=0,
        description=(
            "How far back the gateway remembers the turns it answered (and, for its reuse check, the requests it "
            "read): an end delivered again within it never gets a second reply. Read back from support.replies when "
            "a gateway starts or takes partitions over, so the memory a replica keeps is this window's, whatever its "
            "rate; must cover how long a crashed guard's decisions can take to be republished"
        ),
    )
    commit_interval_ms: float = Field(
        500.0,
        ge=0,
        description=(
            "How often a consumer commits its finished offsets (batched; a crash redelivers at most this much finished"
            " work)"
        ),
    )

    @field_validator("kafka_bootstrap_servers")
    @classmethod
    def _broker_list(cls, value: str | None) -> str | None:
        return None if value is None or not value.strip() else ",".join(parse_bootstrap_servers(value))

    @field_validator("min_insync_replicas")
    @classmethod
    def _min_isr(cls, value: int | None, info: ValidationInfo) -> int | None:
        factor = info.data.get("replication_factor", 1)
        if value is not None and value > factor:
            raise ValueError(
                f"{value} is more than ROUNDTRIP_REPLICATION_FACTOR ({factor}): no write could ever succeed"
            )
        return value

    @property
    def embedded_broker(self) -> bool:
        return not self.kafka_bootstrap_servers


class KafkaSecurity(Concern):
    """Every Kafka client of the fleet (the services, the gateway's transactional producer, `roundtrip topics`, `lag`,
    `ask`, `chat`, `approvals`, `cancel`, `dead-letters`) connects this way. Settings that do not fit together are
    refused at start with one line; the password never shows in `roundtrip config`, a log or a span. Examples for
    Confluent Cloud, Amazon MSK (SCRAM, IAM) and OIDC: the deployment page.

    Outside development (`ROUNDTRIP_ENV`) a service refuses to start on `PLAINTEXT`, where anyone on the network
    can read every record and write any internal topic, and on `SASL_PLAINTEXT` with `PLAIN` or `OAUTHBEARER`, whose
    password or token crosses the network in the clear, unless `ROUNDTRIP_KAFKA_ALLOW_PLAINTEXT=true` says the
    network is trusted on purpose; and on `SSL` without a client certificate, where every client is the broker's
    anonymous principal, unless `ROUNDTRIP_KAFKA_ALLOW_ANONYMOUS=true`. The embedded broker of `roundtrip up` is
    development, so it needs none of them."""

    """How every Kafka client of the fleet connects: TLS and SASL, named after the standard client properties
    (security.protocol, sasl.mechanism, ssl.truststore: services/_kernel/kafka/security.py turns them into aiokafka's
    and FastStream's options)."""

    heading = "Kafka security: TLS and SASL"

    kafka_security_protocol: Annotated[SECURITY_PROTOCOLS, _upper] = Field(
        "PLAINTEXT", description="`PLAINTEXT`, `SSL`, `SASL_PLAINTEXT` or `SASL_SSL` (`security.protocol`)"
    )
    kafka_sasl_mechanism: Annotated[SASL_MECHANISMS | None, _upper] = Field(
        None,
        description=(
            "`PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512` or `OAUTHBEARER` (`sasl.mechanism`); needed with `SASL_*`"
        ),
    )
    kafka_sasl_username: str | None = Field(None, description="SASL user (PLAIN and SCRAM)")
    kafka_sasl_password: SecretStr | None = Field(
        None, json_schema_extra=SECRET, description=("SASL password (PLAIN and SCRAM); never shown")
    )
    kafka_sasl_password_file: ExistingFile = Field(
        None, description="File holding the SASL password (a mounted secret; its first line), instead of the variable"
    )
    kafka_sasl_oauth_token_provider: str | None = Field(
        None,
        description=(
            "OAUTHBEARER: `module:attribute` of an aiokafka `AbstractTokenProvider`, or of a callable making one"
        ),
    )
    kafka_ssl_cafile: ExistingFile = Field(
        None, description="PEM file of the CAs the brokers' certificates are checked against; unset: the system's CAs"
    )
    kafka_ssl_certfile: ExistingFile = Field(None, description="PEM file of this client's certificate (mTLS)")
    kafka_ssl_keyfile: ExistingFile = Field(None, description="PEM file of this client's private key (mTLS)")
    kafka_ssl_key_password: SecretStr | None = Field(
        None, json_schema_extra=SECRET, description=("Password of that key, if it has one; never shown")
    )
    kafka_allow_plaintext: bool = Field(
        False,
        description=(
            "`true`: a service outside development starts on `PLAINTEXT` all the same (a network trusted on purpose); "
            "without it, it refuses to; the same for `SASL_PLAINTEXT` with `PLAIN` or `OAUTHBEARER` (the password or "
            "token in the clear)"
        ),
    )
    kafka_allow_anonymous: bool = Field(
        False,
        description=(
            "`true`: a service outside development starts on `SSL` without a client certificate all the same (every "
            "client the broker's anonymous principal, on purpose); without it, it refuses to"
        ),
    )

    @field_validator(
        "kafka_sasl_mechanism",
        "kafka_sasl_username",
        "kafka_sasl_password",
        "kafka_sasl_password_file",
        "kafka_sasl_oauth_token_provider",
        "kafka_ssl_cafile",
        "kafka_ssl_certfile",
        "kafka_ssl_keyfile",
        "kafka_ssl_key_password",
        mode="before",
    )
    @classmethod
    def _blank_is_unset(
        cls, value: object
    ) -> object:  # an empty key of a Secret or ConfigMap (deploy/k8s) sets nothing
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("kafka_sasl_oauth_token_provider")
    @classmethod
    def _import_string(cls, value: str | None) -> str | None:
        return None if value is None else check_import_string(value.strip())

    @model_validator(mode="after")
    def _fits_together(self) -> KafkaSecurity:
        check_kafka_security(self)
        return self

    @property
    def kafka_secured(self) -> bool:
        return self.kafka_security_protocol != "PLAINTEXT"
