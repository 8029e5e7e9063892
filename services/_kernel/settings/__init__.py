"""Configuration: environment variables with the prefix ROUNDTRIP_ (pydantic-settings), by concern.

Every knob is declared once, in its concern (concerns.py); `Settings` is all of them together, and holds what joins
two concerns (the embedded defaults, the development check, the refusals at start-up). Library code reads no settings
of its own: a service gets the `Settings` it was built with; `get_settings()` is for the entry points only.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Literal

from roundtrip._kernel.settings.base import Concern
from roundtrip._kernel.settings.checks import (
    ASYNC_DRIVERS,
    ConfigurationError,
    InsecureConfiguration,
    check_database_url,
    describe_invalid,
    env_name,
    parse_bootstrap_servers,
)
from roundtrip._kernel.settings.concerns import (
    CONCERNS,
    ConversationSettings,
    Deployment,
    EmbeddedDefaults,
    ExecutorSettings,
    LoopRules,
    ModelPlatform,
    ModelSettings,
    TelemetrySettings,
    TranscriptLimits,
    TurnLedger,
)
from roundtrip._kernel.settings.console import ConsoleSettings
from roundtrip._kernel.settings.kafka import KafkaSecurity, KafkaSettings
from roundtrip._kernel.settings.keys import (
    DEV_BATCH_SIGNING_KEY,
    DEV_BATCH_VERIFY_KEYS,
    DEV_DECISION_SIGNING_KEY,
    DEV_DECISION_VERIFY_KEYS,
    RETIRED_KEY_SETTINGS,
    ApprovalSettings,
    BatchKeys,
)
from roundtrip._kernel.settings.lane import BATCH_PLATFORMS, BatchLane

__all__ = [
    "ASYNC_DRIVERS",
    "CONCERNS",
    "DEV_BATCH_SIGNING_KEY",
    "DEV_BATCH_VERIFY_KEYS",
    "DEV_DECISION_SIGNING_KEY",
    "DEV_DECISION_VERIFY_KEYS",
    "KEY_SETTINGS",
    "ApprovalSettings",
    "BatchKeys",
    "BatchLane",
    "Concern",
    "ConfigurationError",
    "ConsoleSettings",
    "ConversationSettings",
    "Deployment",
    "EmbeddedDefaults",
    "ExecutorSettings",
    "InsecureConfiguration",
    "KafkaSecurity",
    "KafkaSettings",
    "LoopRules",
    "ModelPlatform",
    "ModelSettings",
    "Settings",
    "TelemetrySettings",
    "TranscriptLimits",
    "TurnLedger",
    "check_database_url",
    "describe_invalid",
    "env_name",
    "get_settings",
    "parse_bootstrap_servers",
]


# The key settings, each with the published development value it must not hold outside development.
KEY_SETTINGS = {
    "batch_signing_key": DEV_BATCH_SIGNING_KEY,
    "batch_verify_keys": DEV_BATCH_VERIFY_KEYS,
    "decision_signing_key": DEV_DECISION_SIGNING_KEY,
    "decision_verify_keys": DEV_DECISION_VERIFY_KEYS,
}
MIGRATION = "docs/approvals.md, Migrating from HMAC keys"


class Settings(
    Deployment,
    KafkaSettings,
    KafkaSecurity,
    ModelSettings,
    ModelPlatform,
    LoopRules,
    BatchLane,
    TurnLedger,
    ConversationSettings,
    BatchKeys,
    ExecutorSettings,
    TranscriptLimits,
    ApprovalSettings,
    TelemetrySettings,
    ConsoleSettings,
    EmbeddedDefaults,
):
    @property
    def bootstrap_servers(self) -> str:
        return self.kafka_bootstrap_servers or f"127.0.0.1:{self.kafka_port}"

    @property
    def bootstrap_list(self) -> list[str]:
        """The bootstrap servers as a list (FastStream's KafkaBroker takes a string as one host)."""
        return self.bootstrap_servers.split(",")

    @property
    def model_base_url(self) -> str | None:
        """The endpoint override, else the simulator on the Anthropic API with no key, else None (the SDK's own)."""
        if self.anthropic_base_url:
            return self.anthropic_base_url
        return f"http://127.0.0.1:{self.simulator_port}" if self.use_simulator else None

    @property
    def ledger_db_url(self) -> str:
        if self.ledger_database_url is not None:
            return self.ledger_database_url.get_secret_value()
        return _sqlite(self.state_dir / "ledger.db")

    @property
    def conversations_db_url(self) -> str:
        if self.conversations_database_url is not None:
            return self.conversations_database_url.get_secret_value()
        return self.ledger_db_url

    def trace_link_template(self) -> str | None:
        if self.console_trace_url:
            return self.console_trace_url
        jaeger = (self.console_jaeger_url or self.effective_jaeger_query_url or "").rstrip("/")
        return f"{jaeger}/trace/{{trace_id}}" if jaeger else None

    @property
    def effective_span_file(self) -> Path | None:
        if self.otlp_endpoint and self.span_file is None:
            return None
        return self.span_file or self.state_dir / "spans.jsonl"

    @property
    def development(self) -> bool:
        """The embedded development fleet: ROUNDTRIP_ENV=development, or (unset) the embedded broker in use."""
        if self.env:
            return self.env.strip().lower() in ("development", "dev")
        return self.embedded_broker

    @property
    def batch_lane_available(self) -> bool:
        """The model's platform has the Message Batches the batch lane submits to (docs/decisions/batch-lane.md)."""
        return self.model_provider in BATCH_PLATFORMS

    def lane_of(self, requested: Literal["interactive", "batch"] | None) -> Literal["interactive", "batch"]:
        """The lane a request runs in: its own, else the default; interactive where the platform has no batches."""
        lane = requested or self.default_lane
        return lane if self.batch_lane_available else "interactive"

    def refuse_unavailable_lane(self, service: str) -> None:
        """Raise ConfigurationError when the default lane is batch on a platform without Message Batches."""
        if self.default_lane == "batch" and not self.batch_lane_available:
            raise ConfigurationError(
                f"{service} refuses to start: ROUNDTRIP_DEFAULT_LANE=batch, but ROUNDTRIP_MODEL_PROVIDER="
                f"{self.model_provider} has no Message Batches the fleet submits to (the Anthropic API has them): "
                "set ROUNDTRIP_DEFAULT_LANE=interactive"
            )

    def refuse_private_ledger(self, service: str) -> None:
        """Raise ConfigurationError when a service that shares the turn ledger would keep it in a file of its own: a
        SQLite file in state_dir is shared only by the processes of one folder, so with a disk per process (a pod, a
        container) the services would not meet in the ledger and every turn would fail."""
        if self.ledger_database_url is None and not self.development:
            from roundtrip._kernel.wire import topology

            sharing = [s.name for s in topology.SERVICES if s.shares_ledger]
            raise ConfigurationError(
                f"{service} refuses to start: ROUNDTRIP_LEDGER_DATABASE_URL is not set, so the turn ledger would be a "
                f"private SQLite file in {self.state_dir} that the other services never see, and every turn would "
                "fail. "
                f"Give {', '.join(sharing[:-1])} and {sharing[-1]} the same database "
                "(e.g. postgresql+asyncpg://user:password@host:5432/ledger), "
                "or set ROUNDTRIP_ENV=development for a fleet on one machine."
            )

    def key_text(self, name: str) -> str:
        """The raw value of key setting `name` (a private key's secret included): for the signers and checks only."""
        value = getattr(self, name)
        return value if isinstance(value, str) else value.get_secret_value()

    def refuse_unfit_keys(self, service: str, held: Iterable[str], approvals: bool = True) -> None:
        """Raise ConfigurationError (one line, no key material) for a `held` key that cannot be used, and
        InsecureConfiguration for a published development key outside development (decision keys: if `approvals`)."""
        from roundtrip._kernel.wire.approvals import KeyConfigError, published_in

        for retired, replaced_by in RETIRED_KEY_SETTINGS.items():
            if os.environ.get(retired, "").strip():
                raise ConfigurationError(
                    f"{service} refuses to start: {retired} (HMAC) is retired; Ed25519 key pairs replaced it: "
                    f"{replaced_by}. Make a pair with `roundtrip keys`, then unset {retired} ({MIGRATION})."
                )
        for name in held:
            setting = env_name(name)
            try:
                published = published_in(self.key_text(name), setting, KEY_SETTINGS[name])
            except KeyConfigError as exc:
                raise ConfigurationError(f"{service} refuses to start: {exc}") from None
            if published and not self.development and (approvals or not name.startswith("decision_")):
                whose = "sign batches" if name.startswith("batch_") else "approve a call (the agent has approval rules)"
                raise InsecureConfiguration(
                    f"{service} refuses to start: {setting} holds the published development key, with which anyone "
                    f"can {whose}, and this is not the embedded development fleet (ROUNDTRIP_ENV={self.env or 'unset'}"
                    f", Kafka at {self.kafka_bootstrap_servers}). Make a pair of your own with `roundtrip keys`, or set"
                    " ROUNDTRIP_ENV=development on a laptop."
                )

    def refuse_plaintext_kafka(self, service: str) -> None:
        """Raise InsecureConfiguration outside development for a Kafka connection whose traffic or credential anyone on
        the network can read, unless ROUNDTRIP_KAFKA_ALLOW_PLAINTEXT (PLAINTEXT; SASL_PLAINTEXT with PLAIN or
        OAUTHBEARER), and for SSL without a client certificate (every client the same anonymous principal), unless
        ROUNDTRIP_KAFKA_ALLOW_ANONYMOUS."""
        if self.development:
            return
        protocol, mechanism = self.kafka_security_protocol, self.kafka_sasl_mechanism
        where = f"(Kafka at {self.bootstrap_servers}, ROUNDTRIP_ENV={self.env or 'unset'})"
        laptop = "or ROUNDTRIP_ENV=development on a laptop."
        if protocol == "PLAINTEXT" and not self.kafka_allow_plaintext:
            raise InsecureConfiguration(
                f"{service} refuses to start: ROUNDTRIP_KAFKA_SECURITY_PROTOCOL is PLAINTEXT {where}, so anyone on the "
                "network can read and write the fleet's topics. Set SASL_SSL (or SSL) with its ROUNDTRIP_KAFKA_* "
                f"settings, ROUNDTRIP_KAFKA_ALLOW_PLAINTEXT=true for a network you trust on purpose, {laptop}"
            )
        if protocol == "SASL_PLAINTEXT" and mechanism in ("PLAIN", "OAUTHBEARER") and not self.kafka_allow_plaintext:
            secret = "password" if mechanism == "PLAIN" else "token"
            raise InsecureConfiguration(
                f"{service} refuses to start: ROUNDTRIP_KAFKA_SECURITY_PROTOCOL is SASL_PLAINTEXT with {mechanism} "
                f"{where}, so its {secret} crosses the network in the clear and whoever reads it writes as this "
                "service. Set SASL_SSL, ROUNDTRIP_KAFKA_ALLOW_PLAINTEXT=true for a network you trust on purpose, "
                f"{laptop}"
            )
        if protocol == "SSL" and self.kafka_ssl_certfile is None and not self.kafka_allow_anonymous:
            raise InsecureConfiguration(
                f"{service} refuses to start: ROUNDTRIP_KAFKA_SECURITY_PROTOCOL is SSL without a client certificate "
                f"{where}, so the broker cannot tell this service from anyone who reaches its listener (no ACL per "
                "service can hold). Set ROUNDTRIP_KAFKA_SSL_CERTFILE and ROUNDTRIP_KAFKA_SSL_KEYFILE (mTLS) or "
                "SASL_SSL, ROUNDTRIP_KAFKA_ALLOW_ANONYMOUS=true for a listener open to anyone on purpose, "
                f"{laptop}"
            )

    @property
    def console_local_identity(self) -> str | None:
        """Who the console signs in a request no proxy vouched for, in development only; None elsewhere."""
        if not self.development or self.console_oidc_issuer:
            return None
        if self.console_local_user:
            return self.console_local_user.strip()
        if self.console_trusted_proxies.strip():
            return None
        import getpass
        import socket

        try:
            login = getpass.getuser()
        except (KeyError, OSError):  # a container's user without a name
            login = "developer"
        return f"{login}@{socket.gethostname()}"

    def refuse_weak_session_key(self, service: str) -> None:
        """Raise ConfigurationError outside development for a console session key that is the manifests' placeholder
        or shorter than 32 bytes (anyone who guesses it forges the console's CSRF tokens); never shows the key."""
        key = self.console_session_key.get_secret_value() if self.console_session_key else None
        if key is None or self.development:
            return
        problem = (
            "is the manifest's placeholder CHANGE-ME"
            if "change-me" in key.lower()
            else f"is {len(key.encode())} bytes, shorter than 32"
            if len(key.encode()) < 32
            else None
        )
        if problem:
            raise ConfigurationError(
                f"{service} refuses to start: ROUNDTRIP_CONSOLE_SESSION_KEY {problem}; set it to a secret of your "
                'own, e.g. "$(openssl rand -hex 32)" (the same for every console replica), or leave it unset for one '
                "replica."
            )

    def refuse_console_local_user(self, service: str) -> None:
        """Raise InsecureConfiguration outside development for the console's development-only settings: a local user
        (everyone an approver, unauthenticated), trusted proxy headers, cookies without Secure."""
        if self.console_local_user and not self.development:
            raise InsecureConfiguration(
                f"{service} refuses to start: ROUNDTRIP_CONSOLE_LOCAL_USER signs every visitor in as an approver, and "
                "this is not the embedded development fleet. Put a sign-on proxy in front of the console and name "
                "its issuer in ROUNDTRIP_CONSOLE_OIDC_ISSUER, or set ROUNDTRIP_ENV=development on a laptop."
            )
        if self.console_trusted_proxies.strip() and not self.development:
            raise InsecureConfiguration(
                f"{service} refuses to start: ROUNDTRIP_CONSOLE_TRUSTED_PROXIES believes identity headers on the "
                "word of a source address (anything reaching that address names any approver), and this is not "
                "development. Use the signed mode: ROUNDTRIP_CONSOLE_OIDC_ISSUER and ROUNDTRIP_CONSOLE_OIDC_AUDIENCE."
            )
        if not self.console_secure_cookies and not self.development:
            raise InsecureConfiguration(
                f"{service} refuses to start: ROUNDTRIP_CONSOLE_SECURE_COOKIES is false, so the console's CSRF cookie "
                "would also travel over plain http, and this is not development. Serve the console over HTTPS and "
                "unset it (browsers keep a Secure cookie on http://localhost too), or set ROUNDTRIP_ENV=development."
            )
        placeholder = [
            name
            for name, value in (("ISSUER", self.console_oidc_issuer), ("AUDIENCE", self.console_oidc_audience))
            if value and "change-me" in value.lower()
        ]
        if placeholder and not self.development:
            raise ConfigurationError(
                f"{service} refuses to start: ROUNDTRIP_CONSOLE_OIDC_{placeholder[0]} is the manifest's placeholder "
                "CHANGE-ME; set your OIDC provider's issuer and the client id its tokens are issued for."
            )
        if self.console_oidc_issuer and not self.console_oidc_audience:
            raise ConfigurationError(
                f"{service} refuses to start: ROUNDTRIP_CONSOLE_OIDC_ISSUER is set but ROUNDTRIP_CONSOLE_OIDC_AUDIENCE "
                "is not: name the client id the forwarded tokens are issued for."
            )


def _sqlite(path: Path) -> str:
    return f"sqlite+aiosqlite:///{path.resolve()}"


@lru_cache
def get_settings() -> Settings:
    return Settings()
