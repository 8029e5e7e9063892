"""Configuration: environment variables with the prefix ROUNDTRIP_ (pydantic-settings).

Every knob of the fleet lives here, once. `roundtrip config` prints the effective values.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from pydantic import AliasChoices, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# Demo signing key: fine for a laptop, replaced in production via ROUNDTRIP_APPROVAL_KEYS.
# It is published (README), so anyone can sign a batch with it: outside the embedded
# development fleet the gate and the executor refuse to start while it is configured.
DEV_APPROVAL_KEYS = "dev1:roundtrip-dev-only-approval-key"
DEV_APPROVAL_SECRET = DEV_APPROVAL_KEYS.split(":", 1)[1]
# Demo key people sign approval decisions with (roundtrip approvals); published too, so refused outside
# development while approvals are configured.
DEV_DECISION_KEYS = "ops1:roundtrip-dev-only-decision-key"
DEV_DECISION_SECRET = DEV_DECISION_KEYS.split(":", 1)[1]


# The database drivers the fleet runs on (it is asyncio throughout): backend -> the URL scheme to write.
ASYNC_DRIVERS = {
    "postgresql": ("postgresql+asyncpg", "postgresql+asyncpg://user:password@host:5432/ledger"),
    "sqlite": ("sqlite+aiosqlite", "sqlite+aiosqlite:////var/lib/roundtrip/ledger.db"),
}


class ConfigurationError(RuntimeError):
    """Settings with which a service cannot work: it refuses to start, with one line naming the cause."""


class InsecureConfiguration(ConfigurationError):
    """A setting that must not be used outside development (the published approval key)."""


_HOST = re.compile(r"\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_]([A-Za-z0-9._-]*[A-Za-z0-9_])?")  # a name, an IPv4 or a [IPv6] address


def parse_bootstrap_servers(value: str) -> list[str]:
    """`h1:9092,h2:9092` (spaces allowed) -> ["h1:9092", "h2:9092"]; ValueError naming the entry that is not host:port."""
    entries = [entry.strip() for entry in value.split(",")]
    if not any(entries):
        raise ValueError("empty: give host:port[,host:port...], e.g. broker-1:9092,broker-2:9092")
    for entry in entries:
        host, colon, port = entry.rpartition(":")
        if "://" in entry:
            raise ValueError(f"{entry!r} has a scheme: give host:port (the security protocol is not part of the address)")
        if not colon or not _HOST.fullmatch(host) or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{entry!r} is not host:port; give host:port[,host:port...], e.g. broker-1:9092,broker-2:9092")
    return entries


def check_database_url(value: str) -> str:
    """A URL the fleet's async engines can open: postgresql+asyncpg:// or sqlite+aiosqlite://; ValueError saying which
    form works otherwise. The message shows only the scheme, never the rest (it may carry a password)."""
    scheme, sep, _ = value.partition("://")
    if not sep:
        raise ValueError("not a database URL; write " + " or ".join(example for _, example in ASYNC_DRIVERS.values()))
    backend = scheme.split("+", 1)[0].lower()
    if backend == "postgres":
        backend = "postgresql"
    if backend not in ASYNC_DRIVERS:
        raise ValueError(f"{scheme}:// is not supported; write " + " or ".join(example for _, example in ASYNC_DRIVERS.values()))
    wanted, example = ASYNC_DRIVERS[backend]
    if scheme.lower() != wanted:
        raise ValueError(f"{scheme}:// names a driver the fleet does not use (it is asyncio throughout); write {wanted}://..., "
                         f"e.g. {example}")
    return value


def describe_invalid(error: ValidationError) -> str:
    """One line per invalid setting, named by its environment variable: what `roundtrip` prints instead of a traceback."""
    lines = []
    for item in error.errors():
        name = str(item["loc"][0]) if item.get("loc") else "?"
        variable = "ANTHROPIC_API_KEY" if name == "anthropic_api_key" else f"ROUNDTRIP_{name.upper()}"
        message = item.get("msg", "invalid").removeprefix("Value error, ")
        lines.append(f"{variable}: {message}")
    return "; ".join(lines)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ROUNDTRIP_", extra="ignore")

    # -- where things live -------------------------------------------------------------
    env: str | None = Field(
        None, description="'development' or 'production'; unset: development only with the embedded broker"
    )
    instance_id: str | None = Field(
        None, description="Stable id of this replica (gateway transactional id); default: pod name in Kubernetes, else host-service"
    )
    state_dir: Path = Field(Path(".roundtrip"), description="Folder for embedded broker data, SQLite files, span files, logs")

    # -- broker ------------------------------------------------------------------------
    kafka_bootstrap_servers: str | None = Field(
        None, description="Kafka bootstrap servers; unset means the embedded broker on kafka_port"
    )
    kafka_port: int = Field(9092, description="Port of the embedded broker (client listener)")
    kafka_controller_port: int = Field(9093, description="Port of the embedded broker's KRaft controller")
    kafka_version: str = Field("4.1.1", description="Apache Kafka version fetched from Maven Central for the embedded broker")
    kafka_java_opts: str | None = Field(None, description="JVM options of the embedded broker (default: small heap, serial GC)")
    kafka_log_level: str = Field("INFO", description="Log level of the embedded broker (its log is state_dir/logs/kafka.log)")
    topic_prefix: str = Field("", description="Prefix of every topic name (to share a cluster)")
    partitions: int = Field(6, ge=1, description="Partitions per topic for `roundtrip topics create`")
    executor_partitions: int | None = Field(None, ge=1, description="Partitions of the executor topic (defaults to `partitions`)")
    max_in_flight: int = Field(
        500, ge=1,
        description="Messages each subscription of a service holds at once (one conversation at a time, "
        "many conversations concurrently); at the limit it pauses fetching",
    )
    commit_interval_ms: float = Field(
        500.0, ge=0,
        description="How often a consumer commits its finished offsets (batched; a crash redelivers at most this much finished work)",
    )
    max_running_turns: int = Field(
        200, ge=1, description="Turns the gateway runs at once; more requests wait in support.requests (admission)"
    )
    replication_factor: int = Field(1, ge=1, description="Replication factor of the topics `roundtrip topics create` makes")
    min_insync_replicas: int | None = Field(
        None, ge=1,
        description="min.insync.replicas of the topics `roundtrip topics create` makes (production: 2 with replication "
                    "factor 3); unset: the broker's default",
    )

    # -- model -------------------------------------------------------------------------
    anthropic_api_key: str | None = Field(
        None, validation_alias=AliasChoices("ANTHROPIC_API_KEY", "ROUNDTRIP_ANTHROPIC_API_KEY")
    )
    anthropic_base_url: str | None = Field(None, description="Override the API base URL (the simulator is used when no key is set)")
    model: str = Field("claude-sonnet-4-6", description="Model name sent to the Messages API")
    max_tokens: int = Field(1024, ge=1, description="max_tokens of each model call")
    model_max_retries: int = Field(2, ge=0, description="SDK retries of a failed model call before the turn ends")
    model_timeout_s: float = Field(60.0, gt=0, description="Timeout of one model call")
    listen_host: str = Field("127.0.0.1", description="Address the simulator, the shop and the health endpoints listen on (0.0.0.0 in containers)")
    simulator_port: int = Field(8801, description="Port of the local Messages API simulator")
    simulator_persona: str = Field("careful", description="Persona the simulator plays when a request names none (or 'mix')")
    simulator_latency_ms: float = Field(0.0, ge=0, description="Latency the simulator adds to each response")
    simulator_latency_jitter: float = Field(
        0.0, ge=0, le=1, description="Spread of that latency: 0.3 draws each response's latency from latency_ms ±30 %"
    )

    # -- shop (the demo backend the tools call) -----------------------------------------
    shop_url: str | None = Field(None, description="Base URL of the shop API; unset means the embedded shop on shop_port")
    shop_port: int = Field(8802, description="Port of the embedded demo shop")
    shop_database_url: str | None = Field(
        None, description="SQLAlchemy URL of the shop database; unset means a SQLite file in state_dir"
    )

    # -- guard -------------------------------------------------------------------------
    max_steps: int = Field(10, ge=1, description="Model calls a turn may make before it is stopped")
    loop_rules: bool = Field(True, description="Repeat, cycle and failure-streak detection (off: step limit only)")
    max_identical_calls: int = Field(3, ge=2, description="Identical calls (same fingerprint) a turn may make, even succeeding ones")
    cycle_max_period: int = Field(4, ge=2, description="Longest cycle of steps (A,B,A,B has period 2) the guard looks for")
    cycle_repeats: int = Field(2, ge=2, description="Repetitions of a cycle that end the turn")
    failure_streak: int = Field(4, ge=2, description="Consecutive failing calls that end the turn")
    turn_budget_usd: float = Field(0.50, gt=0, description="Cost a turn may spend on model calls")
    prices: str = Field(
        '{"default": [3.0, 15.0, 3.75, 0.30]}',
        description="JSON: model -> USD per million tokens [input, output, cache write, cache read]; 'default' for the rest",
    )
    stuck_after_s: float = Field(60.0, gt=0, description="A turn with no progress for this long is flagged stuck")
    stuck_grace_s: float = Field(30.0, ge=0, description="A stuck turn is ended this long after it was flagged")
    turn_deadline_s: float = Field(300.0, gt=0, description="A turn is ended when it runs longer than this")
    ledger_database_url: str | None = Field(
        None, description="SQLAlchemy URL of the turn ledger (guard; fence of executor and model); unset means a SQLite file in state_dir"
    )
    outbox_after_s: float = Field(5.0, gt=0, description="The guard's sweeper republishes a recorded decision still unpublished after this long")

    # -- conversations (the guard's history of earlier turns) -------------------------------
    conversations_database_url: str | None = Field(
        None, description="SQLAlchemy URL of the conversation store (history per conversation); unset means the ledger's database"
    )
    history_tokens: int = Field(
        20000, ge=0,
        description="Token budget of a conversation's history (estimate: 4 characters a token); the oldest turns are dropped "
                    "past it, never splitting a tool_use from its tool_result; 0 = requests stand alone",
    )
    conversation_retention_s: float = Field(
        30 * 86400.0, gt=0, description="A conversation idle for this long is deleted with its history (expiry)"
    )
    cache_history: bool = Field(
        True, description="Prompt caching of the history: cache breakpoints on the last message and on the previous request's last message"
    )

    # -- gate / executor ---------------------------------------------------------------
    approval_keys: str = Field(
        DEV_APPROVAL_KEYS,
        description="Comma-separated key_id:secret pairs for signing approved batches; the first one signs",
    )
    tool_timeout_s: float = Field(10.0, gt=0, description="Timeout of one tool execution")
    max_block_bytes: int = Field(
        65536, ge=1024, description="Largest tool input, tool result or text block a transcript carries (larger: an error / cut)"
    )
    max_input_depth: int = Field(32, ge=2, description="Deepest nesting of a tool input (deeper: an is_error tool_result)")
    max_transcript_bytes: int = Field(
        524288, ge=65536, description="A turn's transcript is kept under this (largest old blocks replaced by markers)"
    )
    parallel_tools: bool = Field(True, description="Run the calls of one step concurrently")
    disable_parallel_tool_use: bool = Field(
        False, description="Send tool_choice.disable_parallel_tool_use: at most one tool call per model response (a request may override it)"
    )

    # -- approvals by a person -----------------------------------------------------------
    approval_cancel_above_cents: int | None = Field(
        None, ge=0, description="cancel_order waits for a person's approval when the order's total is above this (cents); unset: never"
    )
    approval_timeout_s: float = Field(
        900.0, gt=0, description="How long a call waits for a decision; then the turn ends with a polite reply (approval_timeout)"
    )
    decision_keys: str = Field(
        DEV_DECISION_KEYS,
        description="Comma-separated key_id:secret pairs approval decisions are signed with (roundtrip approvals signs with the first)",
    )

    # -- telemetry ---------------------------------------------------------------------
    otlp_endpoint: str | None = Field(None, description="OTLP/HTTP endpoint (e.g. http://localhost:4318) for traces")
    span_file: Path | None = Field(None, description="JSON-lines span file; defaults to state_dir/spans.jsonl when no OTLP endpoint")
    span_file_max_mb: float = Field(20.0, ge=0, description="The span file is rotated past this size (MB; 0 = never)")
    span_file_backups: int = Field(3, ge=0, description="Rotated span files kept (spans.jsonl.1 … .N; `roundtrip trace` reads them too)")
    jaeger_query_url: str | None = Field(
        None, description="Jaeger's query API (e.g. http://localhost:16686) for `roundtrip trace`; "
                          "unset: derived from an OTLP endpoint on the standard port 4318, else the span file is read",
    )
    log_level: str = Field("INFO", description="Log level of the services")
    health_port: int = Field(
        0, ge=0, le=65535,
        description="Port of each service's /healthz, /readyz and /metrics (8080 in containers); 0 = off",
    )
    health_port_per_service: bool = Field(
        False,
        description="Add the service's index to health_port (gateway +0, model +1, guard +2, gate +3, executor +4; "
                    "another replica on the host takes the next free port in steps of 5); `roundtrip up --health-port` sets it",
    )

    # -- checks ------------------------------------------------------------------------
    @field_validator("kafka_bootstrap_servers")
    @classmethod
    def _broker_list(cls, value: str | None) -> str | None:
        return None if value is None or not value.strip() else ",".join(parse_bootstrap_servers(value))

    @field_validator("ledger_database_url", "conversations_database_url", "shop_database_url")
    @classmethod
    def _database_url(cls, value: str | None) -> str | None:
        return None if value is None or not value.strip() else check_database_url(value.strip())

    @field_validator("min_insync_replicas")
    @classmethod
    def _min_isr(cls, value: int | None, info) -> int | None:
        factor = info.data.get("replication_factor", 1)
        if value is not None and value > factor:
            raise ValueError(f"{value} is more than ROUNDTRIP_REPLICATION_FACTOR ({factor}): no write could ever succeed")
        return value

    def refuse_private_ledger(self, service: str) -> None:
        """Raise ConfigurationError when a service that shares the turn ledger would keep it in a file of its own.

        Guard, model and executor meet in the ledger (the guard records each step; the model and the executors claim
        it in the turn fence before they act). Unset, the ledger is a SQLite file in this process's state_dir: right
        for the embedded development fleet, whose processes share one folder, and wrong wherever each process has its
        own disk (a pod, a container), where every turn would fail."""
        if self.ledger_database_url is None and not self.development:
            raise ConfigurationError(
                f"{service} refuses to start: ROUNDTRIP_LEDGER_DATABASE_URL is not set, so the turn ledger would be a "
                f"private SQLite file in {self.state_dir} that the other services never see, and every turn would fail. "
                "Give guard, model and executor the same database (e.g. postgresql+asyncpg://user:password@host:5432/ledger), "
                "or set ROUNDTRIP_ENV=development for a fleet on one machine."
            )

    # -- derived -----------------------------------------------------------------------
    @property
    def bootstrap_servers(self) -> str:
        """The bootstrap servers as one string, `h1:9092,h2:9092` (for aiokafka's clients and for messages)."""
        return self.kafka_bootstrap_servers or f"127.0.0.1:{self.kafka_port}"

    @property
    def bootstrap_list(self) -> list[str]:
        """The bootstrap servers as a list (FastStream's KafkaBroker takes a string as one host)."""
        return self.bootstrap_servers.split(",")

    @property
    def embedded_broker(self) -> bool:
        return not self.kafka_bootstrap_servers

    @property
    def development(self) -> bool:
        """The embedded development fleet: ROUNDTRIP_ENV=development, or (unset) the embedded broker in use."""
        if self.env:
            return self.env.strip().lower() in ("development", "dev")
        return self.embedded_broker

    @property
    def dev_approval_key_in_use(self) -> bool:
        """True when any configured approval key (signing or verifying) has the published development secret."""
        return any(part.partition(":")[2].strip() == DEV_APPROVAL_SECRET for part in self.approval_keys.split(","))

    def refuse_dev_approval_key(self, service: str) -> None:
        """Raise InsecureConfiguration when the published development key is configured outside development."""
        if self.dev_approval_key_in_use and not self.development:
            raise InsecureConfiguration(
                f"{service} refuses to start: ROUNDTRIP_APPROVAL_KEYS contains the published development key, which anyone "
                f"can sign batches with, and this is not the embedded development fleet (ROUNDTRIP_ENV={self.env or 'unset'}, "
                f"Kafka at {self.kafka_bootstrap_servers}). Set ROUNDTRIP_APPROVAL_KEYS to a secret of your own, e.g. "
                '"k1:$(openssl rand -hex 32)", or ROUNDTRIP_ENV=development on a laptop.'
            )

    @property
    def approvals_configured(self) -> bool:
        return self.approval_cancel_above_cents is not None

    @property
    def dev_decision_key_in_use(self) -> bool:
        return any(part.partition(":")[2].strip() == DEV_DECISION_SECRET for part in self.decision_keys.split(","))

    def refuse_dev_decision_key(self, service: str) -> None:
        """Raise InsecureConfiguration when approvals are on outside development with the published decision key."""
        if self.approvals_configured and self.dev_decision_key_in_use and not self.development:
            raise InsecureConfiguration(
                f"{service} refuses to start: approvals are configured and ROUNDTRIP_DECISION_KEYS contains the published "
                "development key, with which anyone could approve a call. Set ROUNDTRIP_DECISION_KEYS to a secret of your "
                'own, e.g. "ops1:$(openssl rand -hex 32)", and give it to the people who decide.'
            )

    @property
    def use_simulator(self) -> bool:
        return not self.anthropic_api_key

    @property
    def model_base_url(self) -> str | None:
        if self.anthropic_base_url:
            return self.anthropic_base_url
        return f"http://127.0.0.1:{self.simulator_port}" if self.use_simulator else None

    @property
    def shop_base_url(self) -> str:
        return self.shop_url or f"http://127.0.0.1:{self.shop_port}"

    @property
    def shop_db_url(self) -> str:
        return self.shop_database_url or f"sqlite+aiosqlite:///{(self.state_dir / 'shop.db').resolve()}"

    @property
    def ledger_db_url(self) -> str:
        return self.ledger_database_url or f"sqlite+aiosqlite:///{(self.state_dir / 'ledger.db').resolve()}"

    @property
    def conversations_db_url(self) -> str:
        return self.conversations_database_url or self.ledger_db_url

    @property
    def sweep_interval_s(self) -> float:
        """How often the guard looks for stuck turns: a quarter of the shortest wait, at most 5 s."""
        return max(0.2, min(5.0, self.stuck_after_s / 4, max(self.stuck_grace_s, 0.8) / 4))

    @property
    def effective_jaeger_query_url(self) -> str | None:
        """Where `roundtrip trace` asks Jaeger: the setting, or the query port (16686) of an OTLP endpoint on :4318."""
        if self.jaeger_query_url:
            return self.jaeger_query_url.rstrip("/")
        if self.otlp_endpoint:
            from urllib.parse import urlsplit

            url = urlsplit(self.otlp_endpoint)
            if url.port == 4318 and url.hostname:
                return f"{url.scheme}://{url.hostname}:16686"
        return None

    @property
    def effective_span_file(self) -> Path | None:
        if self.otlp_endpoint and self.span_file is None:
            return None
        return self.span_file or self.state_dir / "spans.jsonl"


@lru_cache
def get_settings() -> Settings:
    return Settings()
