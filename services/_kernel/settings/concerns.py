"""Every knob of the fleet, once, in the concern it belongs to.

Each concern is its own pydantic-settings class reading `ROUNDTRIP_<FIELD>`, so a part that needs one concern asks
for only that one and any caller can build it alone (`LoopRules(max_steps=3)`); `Settings` is all of them. A field
with `secret` in its json_schema_extra is never shown; a secret is a `SecretStr`, and a settings error never repeats
the values it was given (`hide_input_in_errors`: a password set beside a wrong setting stays out of the message).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    AliasChoices,
    BeforeValidator,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.config import JsonDict
from pydantic_settings import BaseSettings, SettingsConfigDict

from roundtrip._kernel.settings.checks import (
    SASL_MECHANISMS,
    SECURITY_PROTOCOLS,
    check_database_url,
    check_import_string,
    check_kafka_security,
    existing_file,
    parse_bootstrap_servers,
)

KEYS: JsonDict = {"secret": "keys"}  # key_id:secret pairs: the ids may be shown, the secrets never
SECRET: JsonDict = {"secret": "value"}
SECRET_URL: JsonDict = {"secret": "url"}  # a URL that may carry a password: shown without it

# Published here, so anyone can sign with them: outside development a service that holds one refuses to start.
DEV_BATCH_SIGNING_KEY = "dev1:/t+ECEMeaxV7ZzdJxjb5iuhb57b4Y0T0YUBzzbViP0k="
DEV_BATCH_VERIFY_KEYS = "dev1:ZPXmekSmiDVxXLUU+HkczA5SeM96Cts84D66Z2KPGuA="
DEV_DECISION_SIGNING_KEY = "ops1:VY8ZvLjJia3z3LHbdEIGtwV3hd+O3myBXulDO6DbZMk="
DEV_DECISION_VERIFY_KEYS = "ops1:yYB9AT5pdbquSTalmxoGUSTYoqt+JDM7RfbFPKzd9ns="
# Retired HMAC settings: a service that finds one set says what replaced it and stops.
RETIRED_KEY_SETTINGS = {
    "ROUNDTRIP_APPROVAL_KEYS": "ROUNDTRIP_BATCH_SIGNING_KEY (the gate) and ROUNDTRIP_BATCH_VERIFY_KEYS (the executors"
    " and the guard)",
    "ROUNDTRIP_DECISION_KEYS": "ROUNDTRIP_DECISION_SIGNING_KEY (the console, `roundtrip approvals`) and "
    "ROUNDTRIP_DECISION_VERIFY_KEYS (the gate and the guard)",
}


def _holds_key(keys: str, published: str) -> bool:
    secret = published.partition(":")[2]
    return any(part.partition(":")[2].strip() == secret for part in keys.split(","))


def _database_url(value: SecretStr | None) -> SecretStr | None:
    url = value.get_secret_value().strip() if value is not None else ""
    return SecretStr(check_database_url(url)) if url else None


DatabaseUrl = Annotated[SecretStr | None, AfterValidator(_database_url)]
_upper = BeforeValidator(lambda value: value.strip().upper() if isinstance(value, str) else value)
ExistingFile = Annotated[Path | None, AfterValidator(existing_file)]


class Concern(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ROUNDTRIP_", extra="ignore", hide_input_in_errors=True)
    heading: ClassVar[str]


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
            "JSON: model -> USD per million tokens [input, output, cache write, cache read]; 'default' for the rest"
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


class GateSettings(Concern):
    """Ed25519 key pairs (`roundtrip keys` makes one): the gate signs each batch it approved, and each call it holds
    for a person, with `ROUNDTRIP_BATCH_SIGNING_KEY`; the executors and the guard check with the public keys of
    `ROUNDTRIP_BATCH_VERIFY_KEYS` and cannot sign. Rotate by adding the new public key to the verify keys everywhere,
    then giving the gate the new private key, then removing the old public key. A value may be `file:<path>` (a mounted
    Secret). The development pair is published, so outside the embedded development fleet (Kafka configured by
    `ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS` and `ROUNDTRIP_ENV` not `development`) a service that holds it refuses to start,
    as it does with a placeholder (`CHANGE-ME`) or a malformed key anywhere."""

    heading = "signed batches: the gate signs, executors and the guard verify"

    batch_signing_key: SecretStr = Field(
        SecretStr(DEV_BATCH_SIGNING_KEY),
        json_schema_extra=KEYS,
        description=(
            "The gate's `key_id:private` (base64 of the 32-byte Ed25519 key) that signs approved batches and holds; "
            "only the gate holds it"
        ),
    )
    batch_verify_keys: str = Field(
        DEV_BATCH_VERIFY_KEYS,
        description=(
            "Comma-separated `key_id:public` keys (base64) executors and the guard check the gate's signatures with; "
            "every listed key verifies (rotation)"
        ),
    )

    @property
    def dev_batch_key_in_use(self) -> bool:
        return _holds_key(self.batch_signing_key.get_secret_value(), DEV_BATCH_SIGNING_KEY) or _holds_key(
            self.batch_verify_keys, DEV_BATCH_VERIFY_KEYS
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


class ApprovalSettings(Concern):
    """People's decisions are signed with an Ed25519 key pair (`roundtrip keys decision`): the console and the
    operators' `roundtrip approvals` sign with `ROUNDTRIP_DECISION_SIGNING_KEY`; the gate and the guard check with the
    public keys of `ROUNDTRIP_DECISION_VERIFY_KEYS` and cannot sign. Rotation, files and the refusals at start are as
    for the batch pair."""

    heading = "approvals by a person"

    approval_timeout_s: float = Field(
        900.0,
        gt=0,
        description=(
            "How long a call waits for a decision; then the turn ends politely (`approval_timeout`) and the call never"
            " runs"
        ),
    )
    decision_signing_key: SecretStr = Field(
        SecretStr(DEV_DECISION_SIGNING_KEY),
        json_schema_extra=KEYS,
        description=(
            "The `key_id:private` Ed25519 key people's decisions are signed with: the console's and `roundtrip "
            "approvals`' only; the published default is refused outside development while approvals are configured "
            "(the agent has an approval rule that can hold a call)"
        ),
    )
    decision_verify_keys: str = Field(
        DEV_DECISION_VERIFY_KEYS,
        description=(
            "Comma-separated `key_id:public` keys the gate and the guard check people's decisions with (rotation: "
            "every listed key verifies)"
        ),
    )

    @property
    def dev_decision_key_in_use(self) -> bool:
        return _holds_key(self.decision_signing_key.get_secret_value(), DEV_DECISION_SIGNING_KEY) or _holds_key(
            self.decision_verify_keys, DEV_DECISION_VERIFY_KEYS
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


class ConsoleSettings(Concern):
    heading = "the console: the web page where people decide held calls and watch turns"

    console_port: int = Field(8803, ge=1, le=65535, description="Port of the console's web page (on listen_host)")
    console_oidc_issuer: str | None = Field(
        None,
        description=(
            "The signed mode: the OIDC issuer (`https://login.example.com/realms/staff`) whose signed token the "
            "sign-on proxy forwards with every request; its keys come from the issuer's discovery document. Set, "
            "only a token it signed is believed (issuer, audience, expiry, signature)"
        ),
    )
    console_oidc_audience: str | None = Field(
        None, description="The audience (`aud`) the forwarded token must name: the sign-on proxy's client id"
    )
    console_oidc_jwks_url: str | None = Field(
        None,
        description=(
            "Where the issuer's keys are, when it publishes no discovery document (Google IAP: "
            "`https://www.gstatic.com/iap/verify/public_key-jwk`); unset: the discovery document's `jwks_uri`"
        ),
    )
    console_oidc_token_headers: str = Field(
        "authorization,x-forwarded-access-token",
        description=(
            "Comma-separated request headers the token is read from, the first present wins (`authorization`: "
            "`Bearer <token>`; oauth2-proxy: `x-forwarded-access-token`; Google IAP: `x-goog-iap-jwt-assertion`)"
        ),
    )
    console_oidc_name_claims: str = Field(
        "email,preferred_username,sub", description="The token's claims that name the person, the first present wins"
    )
    console_oidc_groups_claim: str = Field(
        "groups", description="The token's claim holding the person's groups (a list, or a comma-separated string)"
    )
    console_trusted_proxies: str = Field(
        "",
        description=(
            "Development only (refused elsewhere: use the signed mode): comma-separated addresses or networks of a "
            "proxy whose X-Forwarded-User / -Email / -Groups headers are believed on its word alone"
        ),
    )
    console_approver_groups: str = Field(
        "roundtrip-approvers",
        description="Comma-separated groups (the token's group claim) whose members may approve, deny and cancel",
    )
    console_viewer_groups: str = Field(
        "roundtrip-viewers", description="Comma-separated groups whose members may look (the inbox, the turns) only"
    )
    console_local_user: str | None = Field(
        None,
        description=(
            "Development only: who a request no proxy signed in is (an approver); unset in development: "
            "`<login>@<host>` of the console's process; outside development it is refused"
        ),
    )
    console_session_key: SecretStr | None = Field(
        None,
        json_schema_extra=SECRET,
        description=(
            "Secret the console's CSRF tokens are signed with; several replicas need the same one; unset: a random "
            "one per process; outside development a placeholder (`CHANGE-ME`) or one shorter than 32 bytes is refused"
        ),
    )
    console_secure_cookies: bool = Field(
        True,
        description=(
            "The console's cookie is Secure (HTTPS only; browsers accept it on http://localhost too); `false` is "
            "refused outside development"
        ),
    )
    console_jaeger_url: str | None = Field(
        None, description="Jaeger's UI the console links a turn's trace to; unset: the Jaeger query URL, if any"
    )
    console_trace_url: str | None = Field(
        None,
        description=(
            "Where the console links a turn's trace: a URL with {trace_id} in it (any tracing UI); unset: "
            "Jaeger's page of the trace at the console's Jaeger URL"
        ),
    )

    @field_validator("console_trace_url")
    @classmethod
    def _trace_template(cls, value: str | None) -> str | None:
        if value and ("{trace_id}" not in value or not value.startswith(("http://", "https://"))):
            raise ValueError(
                "an http(s) URL with {trace_id} where the trace id goes, e.g. https://jaeger/trace/{trace_id}"
            )
        return value or None


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
    TurnLedger,
    ConversationSettings,
    GateSettings,
    ExecutorSettings,
    TranscriptLimits,
    ApprovalSettings,
    TelemetrySettings,
    ConsoleSettings,
    EmbeddedDefaults,
)
