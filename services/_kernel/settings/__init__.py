"""Configuration: environment variables with the prefix ROUNDTRIP_ (pydantic-settings), by concern.

Every knob is declared once, in its concern (services/_kernel/settings/concerns.py: Kafka, the model, the
loop rules, ...). `Settings` is all the concerns together: what a service is built with, and where what
joins two concerns lives (the broker address the embedded default stands in for, the development check,
the refusals at start-up). A part that needs one concern takes that class (`EmbeddedKafka.of(EmbeddedDefaults)`),
and a `Settings` is one of each. `roundtrip config` prints the effective values, grouped by concern.

Nothing in the fleet's library code reads settings of its own: a service gets the `Settings` it was built
with. `get_settings()` is for the entry points (the CLI, `python -m ...`) only.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

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
    DEV_APPROVAL_KEYS,
    DEV_APPROVAL_SECRET,
    DEV_DECISION_KEYS,
    DEV_DECISION_SECRET,
    ApprovalSettings,
    Concern,
    ConsoleSettings,
    ConversationSettings,
    Deployment,
    EmbeddedDefaults,
    ExecutorSettings,
    GateSettings,
    KafkaSecurity,
    KafkaSettings,
    LoopRules,
    ModelSettings,
    TelemetrySettings,
    TranscriptLimits,
    TurnLedger,
)

__all__ = [
    "ASYNC_DRIVERS",
    "CONCERNS",
    "DEV_APPROVAL_KEYS",
    "DEV_APPROVAL_SECRET",
    "DEV_DECISION_KEYS",
    "DEV_DECISION_SECRET",
    "ApprovalSettings",
    "Concern",
    "ConsoleSettings",
    "ConfigurationError",
    "ConversationSettings",
    "Deployment",
    "EmbeddedDefaults",
    "ExecutorSettings",
    "GateSettings",
    "InsecureConfiguration",
    "KafkaSecurity",
    "KafkaSettings",
    "LoopRules",
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


class Settings(
    Deployment,
    KafkaSettings,
    KafkaSecurity,
    ModelSettings,
    LoopRules,
    TurnLedger,
    ConversationSettings,
    GateSettings,
    ExecutorSettings,
    TranscriptLimits,
    ApprovalSettings,
    TelemetrySettings,
    ConsoleSettings,
    EmbeddedDefaults,
):
    """The fleet's settings: every concern (CONCERNS), and what needs more than one of them."""

    # -- where the real parts are: the configured one, else the embedded default -------------
    @property
    def bootstrap_servers(self) -> str:
        """The bootstrap servers as one string, `h1:9092,h2:9092` (for aiokafka's clients and for messages)."""
        return self.kafka_bootstrap_servers or f"127.0.0.1:{self.kafka_port}"

    @property
    def bootstrap_list(self) -> list[str]:
        """The bootstrap servers as a list (FastStream's KafkaBroker takes a string as one host)."""
        return self.bootstrap_servers.split(",")

    @property
    def model_base_url(self) -> str | None:
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

    @property
    def effective_span_file(self) -> Path | None:
        if self.otlp_endpoint and self.span_file is None:
            return None
        return self.span_file or self.state_dir / "spans.jsonl"

    # -- development, and what is refused outside it ----------------------------------------
    @property
    def development(self) -> bool:
        """The embedded development fleet: ROUNDTRIP_ENV=development, or (unset) the embedded broker in use."""
        if self.env:
            return self.env.strip().lower() in ("development", "dev")
        return self.embedded_broker

    def refuse_private_ledger(self, service: str) -> None:
        """Raise ConfigurationError when a service that shares the turn ledger would keep it in a file of its own.

        The services the topology marks `shares_ledger` meet in the ledger (the guard records each step; the model
        and the executors claim it in the turn fence before they act; the gateway reads which turns wait for capacity).
        Unset, the ledger is a SQLite file in this process's state_dir: right for the embedded development fleet, whose
        processes share one folder, and wrong wherever each process has its own disk (a pod, a container), where every
        turn would fail."""
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

    def refuse_dev_approval_key(self, service: str) -> None:
        """Raise InsecureConfiguration when the published development key is configured outside development."""
        if self.dev_approval_key_in_use and not self.development:
            raise InsecureConfiguration(
                f"{service} refuses to start: ROUNDTRIP_APPROVAL_KEYS contains the published development key, which "
                "anyone "
                "can sign batches with, and this is not the embedded development fleet "
                f"(ROUNDTRIP_ENV={self.env or 'unset'}, "
                f"Kafka at {self.kafka_bootstrap_servers}). Set ROUNDTRIP_APPROVAL_KEYS to a secret of your own, e.g. "
                '"k1:$(openssl rand -hex 32)", or ROUNDTRIP_ENV=development on a laptop.'
            )

    def refuse_plaintext_kafka(self, service: str) -> None:
        """Raise InsecureConfiguration when a service would talk to Kafka in the clear outside development: on PLAINTEXT
        anyone on the network reads every record and can write any internal topic, so only an explicit
        ROUNDTRIP_KAFKA_ALLOW_PLAINTEXT lets it through."""
        if self.kafka_security_protocol == "PLAINTEXT" and not self.kafka_allow_plaintext and not self.development:
            raise InsecureConfiguration(
                f"{service} refuses to start: ROUNDTRIP_KAFKA_SECURITY_PROTOCOL is PLAINTEXT (Kafka at "
                f"{self.bootstrap_servers}, ROUNDTRIP_ENV={self.env or 'unset'}), so anyone on the network can read "
                "and write the fleet's topics. Set SASL_SSL (or SSL) with its ROUNDTRIP_KAFKA_* settings, "
                "ROUNDTRIP_KAFKA_ALLOW_PLAINTEXT=true for a network you trust on purpose, or ROUNDTRIP_ENV=development "
                "on a laptop."
            )

    def refuse_dev_decision_key(self, service: str, approvals: bool) -> None:
        """Raise InsecureConfiguration when approvals are on (`approvals`: the agent has a rule that can hold a call)
        outside development with the published decision key."""
        if approvals and self.dev_decision_key_in_use and not self.development:
            raise InsecureConfiguration(
                f"{service} refuses to start: the agent has approval rules and ROUNDTRIP_DECISION_KEYS contains the "
                "published "
                "development key, with which anyone could approve a call. Set ROUNDTRIP_DECISION_KEYS to a secret of "
                "your "
                'own, e.g. "ops1:$(openssl rand -hex 32)", and give it to the people who decide.'
            )

    # -- the console's sign-in -------------------------------------------------------------
    @property
    def console_local_identity(self) -> str | None:
        """Who the console signs in a request no proxy vouched for: in development only (ROUNDTRIP_CONSOLE_LOCAL_USER,
        else `<login>@<host>` when no proxy is configured); None elsewhere."""
        if not self.development:
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

    def refuse_console_local_user(self, service: str) -> None:
        """Raise InsecureConfiguration when a local user (everyone an approver, unauthenticated) is set outside
        development."""
        if self.console_local_user and not self.development:
            raise InsecureConfiguration(
                f"{service} refuses to start: ROUNDTRIP_CONSOLE_LOCAL_USER signs every visitor in as an approver, and "
                "this is not the embedded development fleet. Put a sign-on proxy in front of the console and name it "
                "in ROUNDTRIP_CONSOLE_TRUSTED_PROXIES, or set ROUNDTRIP_ENV=development on a laptop."
            )


def _sqlite(path: Path) -> str:
    return f"sqlite+aiosqlite:///{path.resolve()}"


@lru_cache
def get_settings() -> Settings:
    """The process's settings, read once from the environment: for the entry points (the CLI), not library code."""
    return Settings()
