"""Every knob of the fleet, once, in the concern it belongs to.

Each concern is its own pydantic-settings class reading `ROUNDTRIP_<FIELD>`, so a part that needs one concern asks
for only that one and any caller can build it alone (`LoopRules(max_steps=3)`); `Settings` is all of them. A field
with `secret` in its json_schema_extra is never shown; a secret is a `SecretStr`, and a settings error never repeats
the values it was given (`hide_input_in_errors`: a password set beside a wrong setting stays out of the message).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import (
    AliasChoices,
    Field,
    SecretStr,
    field_validator,
)

from roundtrip._kernel.settings.base import SECRET, SECRET_URL, Concern, DatabaseUrl
from roundtrip._kernel.settings.console import ConsoleSettings
from roundtrip._kernel.settings.kafka import KafkaSecurity, KafkaSettings
from roundtrip._kernel.settings.keys import ApprovalSettings, BatchKeys
from roundtrip._kernel.settings.lane import BatchLane


class Deployment(Concern):
    heading = "where things live"

    env: str | None = Field(
        None,
        description=(
            "`development` or `production`; unset: development only with the embedded broker (the published "
            "development keys are refused outside development)"
        ),
    )
    agent: str | None = Field(
        None,
        description=(
            "The agent the fleet runs: `package.module:attribute`, or a name in the entry-point group "
            "`roundtrip.agents`; unset: the demo agent (see Your own agent in the manual)"
        ),
    )
    agent_version: str = Field(
        "",
        pattern=r"^[A-Za-z0-9_-]{0,40}$",
        description=(
            "The agent version a model, gate or executor process serves: it reads that version's own topics, so a turn "
            "runs every step on the version it started on (docs/decisions/agent-versions.md); empty: the default "
            "version. The guard, the gateway and the console serve every version: refused there"
        ),
    )
    instance_id: str | None = Field(
        None,
        description=(
            "Stable id of this replica (the gateway's transactional id); default: the pod name in Kubernetes, else "
            "host + service; `roundtrip up` gives each child its own"
        ),
    )
    state_dir: Path = Field(
        Path(".roundtrip"), description=("Folder for embedded broker data, SQLite files, span files, logs")
    )
    listen_host: str = Field(
        "127.0.0.1",
        description=(
            "Address the simulator, an agent's embedded backend and the health endpoints listen on (0.0.0.0 in "
            "containers)"
        ),
    )


class ModelSettings(Concern):
    """Setting `ROUNDTRIP_ANTHROPIC_BASE_URL` always wins over the real API's URL, even with a key."""

    heading = "the model"

    anthropic_api_key: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices("ANTHROPIC_API_KEY", "ROUNDTRIP_ANTHROPIC_API_KEY"),
        json_schema_extra=SECRET,
        description="The real Anthropic API is used when set (also ROUNDTRIP_ANTHROPIC_API_KEY)",
    )
    anthropic_base_url: str | None = Field(
        None,
        description=(
            "Override the endpoint on every platform (a VPC endpoint, the simulator): the base URL its SDK client "
            "takes; on the Anthropic API with no key the simulator is used"
        ),
    )
    model_provider: Literal["anthropic", "bedrock", "vertex", "foundry"] = Field(
        "anthropic",
        description=(
            "`anthropic` (the Anthropic API), `bedrock` (Amazon Bedrock), `vertex` (Google Vertex AI) or `foundry` "
            "(Microsoft Foundry); a platform's client comes with the package's extra of that name"
        ),
    )
    model: str = Field(
        "claude-sonnet-4-6",
        description=(
            "Model id sent to the Messages API: on bedrock `anthropic.claude-...` or an inference profile "
            "(`us.anthropic.claude-...`, an ARN), on vertex `claude-...` or `claude-...@DATE`"
        ),
    )
    max_tokens: int = Field(1024, ge=1, description="max_tokens of each model call")
    model_max_retries: int = Field(
        2,
        ge=0,
        description=(
            "Retries of a model call after a transient error (timeout, connection, 5xx) before the turn ends; 429 and "
            "529 are retried until the turn's deadline"
        ),
    )
    model_timeout_s: float = Field(60.0, gt=0, description="Timeout of one model call")
    disable_parallel_tool_use: bool = Field(
        False,
        description=(
            'Send `tool_choice: {"type": "auto", "disable_parallel_tool_use": true}`: at most one tool call per model '
            "response (a request may override it)"
        ),
    )
    stream_replies: bool = Field(
        False,
        description=(
            "Stream the text of every model call to support.stream as it is written (a request's `stream` overrides "
            "it); the reply still comes once, on support.replies"
        ),
    )
    stream_chunk_ms: float = Field(
        100.0, gt=0, description="Streamed text waits at most this long before it is published as one chunk"
    )
    stream_chunk_chars: int = Field(
        400, ge=1, description="Streamed text is published as soon as this many characters wait, however soon"
    )
    cache_history: bool = Field(
        True,
        description=(
            "Prompt caching of the history: cache breakpoints on the last message and on the previous request's last "
            "message (off: only tools and system prompt are cached)"
        ),
    )

    @property
    def use_simulator(self) -> bool:
        """The Anthropic API with no key: the local simulator stands in (for a platform: only at its base URL)."""
        return self.model_provider == "anthropic" and (
            self.anthropic_api_key is None or not self.anthropic_api_key.get_secret_value()
        )


class ModelPlatform(Concern):
    """Where the model is reached: the Anthropic API, or Claude on a cloud platform through the SDK's own client for it
    (services/_model/providers.py). Credentials come the platform's standard way (the AWS default chain, Google's
    application default credentials, an Azure key or Microsoft Entra ID); `ROUNDTRIP_ANTHROPIC_BASE_URL` overrides the
    endpoint on every platform."""

    heading = "the model's platform"

    model_region: str | None = Field(
        None,
        description=(
            "bedrock: the AWS region (else AWS_REGION, AWS_DEFAULT_REGION or the profile's); vertex: the Google Cloud "
            "region, e.g. us-east5, europe-west1 or global (else CLOUD_ML_REGION)"
        ),
    )
    vertex_project_id: str | None = Field(
        None, description="vertex: the Google Cloud project (else ANTHROPIC_VERTEX_PROJECT_ID, else the credentials')"
    )
    vertex_access_token: SecretStr | None = Field(
        None,
        json_schema_extra=SECRET,
        description=(
            "vertex: an OAuth access token used as is, instead of the application default credentials (which refresh "
            "their own)"
        ),
    )
    foundry_resource: str | None = Field(
        None,
        description=(
            "foundry: the Foundry resource, `NAME` of https://NAME.services.ai.azure.com/anthropic/ (else "
            "ANTHROPIC_FOUNDRY_RESOURCE)"
        ),
    )
    foundry_api_key: SecretStr | None = Field(
        None,
        json_schema_extra=SECRET,
        description="foundry: the resource's key (else ANTHROPIC_FOUNDRY_API_KEY)",
    )
    foundry_entra_id: bool = Field(
        False,
        description=(
            "foundry: sign in with Microsoft Entra ID (azure-identity's DefaultAzureCredential: workload identity, a "
            "managed identity, the Azure CLI) instead of a key"
        ),
    )

    @field_validator("model_region", "vertex_project_id", "foundry_resource", mode="before")
    @classmethod
    def _blank_is_unset(cls, value: object) -> object:  # an empty key of a ConfigMap (deploy/k8s) sets nothing
        return None if isinstance(value, str) and not value.strip() else value


class LoopRules(Concern):
    heading = "loop rules: how many turns run, and when the guard stops one"

    max_running_turns: int = Field(
        200, ge=1, description="Turns the gateway runs at once; more requests wait in `support.requests` (admission)"
    )
    max_steps: int = Field(10, ge=1, description="Model calls a turn may make before it is stopped")
    loop_rules: bool = Field(True, description="Repeat, cycle and failure-streak detection (off: step limit only)")
    max_identical_calls: int = Field(
        3, ge=2, description=("Identical calls (same fingerprint) a turn may make, even succeeding ones")
    )
    cycle_max_period: int = Field(
        4, ge=2, description=("Longest cycle of steps (A,B,A,B has period 2) the guard looks for")
    )
    cycle_repeats: int = Field(2, ge=2, description="Repetitions of a cycle that end the turn")
    failure_streak: int = Field(4, ge=2, description="Consecutive failing calls that end the turn")
    turn_budget_usd: float = Field(0.50, gt=0, description="Cost a turn may spend on model calls")
    prices: str = Field(
        '{"default": [3.0, 15.0, 3.75, 0.30]}',
        description=(
            "JSON: model -> USD per million tokens [input, output, cache write, cache read]; 'default' for the rest; "
            "'batch:<model>' that model's Message Batches price (else half its price)"
        ),
    )
    stuck_after_s: float = Field(60.0, gt=0, description="A turn with no progress for this long is flagged stuck")
    stuck_grace_s: float = Field(30.0, ge=0, description="A stuck turn is ended this long after it was flagged")
    turn_deadline_s: float = Field(300.0, gt=0, description="A turn is ended when it runs longer than this")

    @property
    def sweep_interval_s(self) -> float:
        """How often the guard looks for stuck turns: a quarter of the shortest wait, at most 5 s."""
        return max(0.2, min(5.0, self.stuck_after_s / 4, max(self.stuck_grace_s, 0.8) / 4))


POOL_SIZE = 10  # PostgreSQL connections a process keeps open to one database


class TurnLedger(Concern):
    heading = "the turn ledger: the guard's record of every turn, the fence of model and executor"

    ledger_database_url: DatabaseUrl = Field(
        None,
        json_schema_extra=SECRET_URL,
        description=(
            "SQLAlchemy URL of the turn ledger (the guard's, the fence the executor and model service check, the "
            "principals the gate authorizes for), `postgresql+asyncpg://…` or `sqlite+aiosqlite:///…`; unset means a "
            "SQLite file in state_dir, which only the development fleet may use (every service that shares it refuses "
            "to start without it elsewhere)"
        ),
    )
    database_allow_shared_login: bool = Field(
        False,
        description=(
            "`true`: a service outside development starts on PostgreSQL with a login that may do more than its part "
            "(the owner's, one shared by the fleet: a database trusted on purpose); without it, it refuses to, naming "
            "the grant to remove (`roundtrip db roles` makes a login per service)"
        ),
    )
    outbox_after_s: float = Field(
        5.0, gt=0, description=("The guard's sweeper republishes a recorded decision still unpublished after this long")
    )
    ledger_retention_s: float = Field(
        14 * 86400.0,
        gt=0,
        description=(
            "An ended turn (its approvals and side-effect records with it) is deleted this long (14 days) after its "
            "end, by the guard's sweeper in small batches. It recognises a request delivered again, so it must "
            "outlast the requests topic's retention.ms: the guard refuses to start when it is shorter"
        ),
    )
    database_pool_size: int = Field(
        POOL_SIZE,
        ge=1,
        le=1000,
        description=(
            "PostgreSQL connections each process keeps open to the ledger (the guard also to the conversation store), "
            "and no more: a statement that finds them all busy waits for one (an extra connection per statement cost "
            "far more under load: docs/decisions/ledger-statements.md). The server's `max_connections` must cover "
            "every replica's: guard 2x, model and executor 1x each, gateway 1"
        ),
    )


class ConversationSettings(Concern):
    heading = "conversations: the guard's history of earlier turns"

    conversations_database_url: DatabaseUrl = Field(
        None,
        json_schema_extra=SECRET_URL,
        description=(
            "SQLAlchemy URL of the conversation store (the guard's history per conversation); unset means the ledger's"
            " database"
        ),
    )
    history_tokens: int = Field(
        20000,
        ge=0,
        description=(
            "Token budget of a conversation's history (estimated at 4 characters a token): the oldest turns are "
            "dropped past it, never splitting a tool_use from its tool_result; 0: every request stands alone"
        ),
    )
    conversation_retention_s: float = Field(
        30 * 86400.0, gt=0, description="A conversation idle this long (30 days) is deleted with its history"
    )


class ExecutorSettings(Concern):
    heading = "the executor"

    tool_timeout_s: float = Field(10.0, gt=0, description="Timeout of one tool execution")
    parallel_tools: bool = Field(True, description="Run the calls of one step concurrently")


class TranscriptLimits(Concern):
    heading = "sizes: what a transcript carries"

    max_block_bytes: int = Field(
        65536,
        ge=1024,
        description=(
            "Largest tool input, tool result or text block a transcript carries (a larger input: an `is_error` result;"
            " a larger result or text: cut)"
        ),
    )
    max_input_depth: int = Field(32, ge=2, description="Deepest nesting of a tool input (deeper: an `is_error` result)")
    max_transcript_bytes: int = Field(
        524288,
        ge=65536,
        description=("A turn's transcript is kept under this (its largest old blocks replaced by markers)"),
    )


class TelemetrySettings(Concern):
    heading = "telemetry: traces, logs, health and metrics"

    otlp_endpoint: str | None = Field(None, description="OTLP/HTTP endpoint (e.g. http://localhost:4318) for traces")
    span_file: Path | None = Field(
        None, description=("JSON-lines span file; defaults to state_dir/spans.jsonl when no OTLP endpoint")
    )
    span_file_max_mb: float = Field(20.0, ge=0, description="The span file is rotated past this size (MB; 0 = never)")
    span_file_backups: int = Field(
        3, ge=0, description=("Rotated span files kept (spans.jsonl.1 … .N; `roundtrip trace` reads them too)")
    )
    jaeger_query_url: str | None = Field(
        None,
        description="Jaeger's query API (e.g. http://localhost:16686) for `roundtrip trace`; "
        "unset: derived from an OTLP endpoint on the standard port 4318, else the span file is read",
    )
    log_level: str = Field("INFO", description="Log level of the services")
    health_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="Port of each service's /healthz, /readyz and /metrics (8080 in containers); 0 = off",
    )
    health_port_per_service: bool = Field(
        False,
        description=(
            "Add the service's index to health_port (gateway +0, model +1, guard +2, gate +3, executor +4, console +5; "
            "another replica on the host takes the next free port in steps of 6); `roundtrip up --health-port` sets it"
        ),
    )

    @property
    def effective_jaeger_query_url(self) -> str | None:
        """Where `roundtrip trace` asks Jaeger: the setting, or the query port (16686) of an OTLP endpoint on :4318."""
        if self.jaeger_query_url:
            return self.jaeger_query_url.rstrip("/")
        if self.otlp_endpoint:
            url = urlsplit(self.otlp_endpoint)
            if url.port == 4318 and url.hostname:
                return f"{url.scheme}://{url.hostname}:16686"
        return None


class EmbeddedDefaults(Concern):
    heading = "embedded defaults: the broker and the Messages API simulator the fleet runs itself"

    kafka_port: int = Field(9092, description="Port of the embedded broker (client listener)")
    kafka_controller_port: int = Field(9093, description="Port of the embedded broker's KRaft controller")
    kafka_version: str = Field(
        "4.1.1", description=("Apache Kafka version fetched from Maven Central for the embedded broker")
    )
    kafka_java_opts: str | None = Field(
        None, description=("JVM options of the embedded broker (default: small heap, serial GC)")
    )
    kafka_log_level: str = Field(
        "INFO", description=("Log level of the embedded broker (its log is state_dir/logs/kafka.log)")
    )
    kafka_cache: Path | None = Field(
        None, description=("Folder of the fetched Kafka jars; unset: `~/.cache/roundtrip/kafka-<version>`")
    )
    kafka_pom: Path | None = Field(
        None,
        description=(
            "The pom.xml the jars are fetched with (e.g. one naming a Maven mirror); unset: `deploy/kafka/pom.xml`"
        ),
    )
    simulator_port: int = Field(8801, description="Port of the local Messages API simulator")
    simulator_persona: str = Field(
        "careful", description=("Persona the simulator plays when a request names none (or 'mix')")
    )
    simulator_latency_ms: float = Field(0.0, ge=0, description="Latency the simulator adds to each response")
    simulator_latency_jitter: float = Field(
        0.0,
        ge=0,
        le=1,
        description=("Spread of that latency: `0.3` draws each response's latency from latency_ms ±30 %"),
    )
    simulator_rpm: int | None = Field(
        None,
        ge=1,
        description=(
            "Requests per minute the simulator admits (a bucket refilled continuously, like the API's); unset: no limit"
        ),
    )
    simulator_itpm: int | None = Field(
        None, ge=1, description=("Input tokens per minute it admits (cache reads do not count); unset: no limit")
    )
    simulator_otpm: int | None = Field(
        None,
        ge=1,
        description=(
            "Output tokens per minute it admits (max_tokens taken up front, the unused part given back); unset: no "
            "limit"
        ),
    )
    simulator_overload_every: float | None = Field(
        None, gt=0, description=("Seconds between the simulator's bursts of 529 overloaded errors; unset: none")
    )
    simulator_overload_seconds: float = Field(5.0, gt=0, description="How long each of those bursts lasts")
    simulator_batch_delay_ms: float = Field(
        2000.0, ge=0, description="How long a Message Batch the simulator takes stays in progress before it ends"
    )
    simulator_script: Path | None = Field(
        None,
        description=(
            "JSON file of scripts the simulator plays for persona script:NAME (services/_simulator/scripted.py)"
        ),
    )


CONCERNS: tuple[type[Concern], ...] = (
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
)
