"""The messages that flow between the services: pydantic models, JSON on the wire.

Commands are imperative (CallModel, ExecuteToolBatch), events past tense (ModelResponded, TurnEnded). Every internal
message carries the `Turn` (who asked, under which principal) and is keyed by conversation id on Kafka. The transcript
travels with the turn, so every service is stateless but for the guard's ledger and conversation store and the
agent's own backends. The class docstrings are the public contract's descriptions (schemas/, contracts/).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import ConfigDict, Field, JsonValue, field_validator

from roundtrip._kernel.wire.letters import DeadLettered, DeadLetterHandled
from roundtrip._kernel.wire.limits import (
    METADATA_MAX_BYTES,
    METADATA_MAX_KEY_CHARS,
    METADATA_MAX_KEYS,
    MetadataKey,
    bounded_metadata,
)
from roundtrip._kernel.wire.message import Message


class SupportRequest(Message):
    """What a client publishes to `support.requests`. Unknown fields are ignored (the gateway logs and counts them)."""

    model_config = ConfigDict(extra="allow")  # a producer may add fields before the fleet knows them

    request_id: str = Field(
        min_length=1,
        max_length=200,
        description="Client's id of this request, unique within its conversation; a duplicate gets no second reply",
    )
    conversation_id: str = Field(
        min_length=1, max_length=200, description="Kafka key; a conversation's turns stay in order"
    )
    customer_id: str = Field(
        min_length=1, max_length=200, description="The authenticated customer: the only principal tools act for"
    )
    text: str = Field(min_length=1, max_length=8000, description="What the customer wrote")
    persona: str | None = Field(
        None, max_length=40, description="Simulator persona for this request (ignored by the real API)"
    )
    disable_parallel_tool_use: bool | None = Field(
        None, description="At most one tool call per model response for this request (null: the deployment's setting)"
    )
    stream: bool | None = Field(
        None,
        description="Stream the text of each model call to support.stream as it is written (null: the deployment's "
        "setting, ROUNDTRIP_STREAM_REPLIES); the reply still comes once, on support.replies",
    )
    lane: Literal["interactive", "batch"] | None = Field(
        None,
        description="batch: the turn's model calls go through Message Batches (half the price, answers within hours); "
        "default: the fleet's ROUNDTRIP_DEFAULT_LANE",
    )
    metadata: dict[MetadataKey, JsonValue] | None = Field(
        None,
        max_length=METADATA_MAX_KEYS,
        description=f"The app's own facts about the request (locale, channel, tier, ...): at most {METADATA_MAX_KEYS} "
        f"keys of 1 to {METADATA_MAX_KEY_CHARS} characters, {METADATA_MAX_BYTES} bytes of JSON; carried to the tools, "
        "the trace and the reply",
    )

    @field_validator("metadata")
    @classmethod
    def _bounded(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return bounded_metadata(value)


class Usage(Message):
    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(**{k: getattr(self, k) + getattr(other, k) for k in Usage.model_fields})


class Outcome(StrEnum):
    """How a turn ended. The first six mirror the model's stop_reason; `invalid_request`: no turn started (`reason`)."""

    END_TURN = "end_turn"
    MAX_TOKENS = "max_tokens"
    STOP_SEQUENCE = "stop_sequence"
    REFUSAL = "refusal"
    CONTEXT_WINDOW_EXCEEDED = "model_context_window_exceeded"
    UNKNOWN_STOP_REASON = "unknown_stop_reason"
    STEP_LIMIT = "step_limit"
    REPEATED_CALL = "repeated_call"
    CYCLE = "cycle"
    FAILURE_STREAK = "failure_streak"
    BUDGET = "budget"
    DEADLINE = "deadline"
    CANCELLED = "cancelled"
    MODEL_ERROR = "model_error"
    MODEL_BUSY = "model_busy"  # the Messages API stayed at its rate limit (429, 529) until the turn's deadline
    CONVERSATION_REFUSED = "conversation_refused"
    APPROVAL_TIMEOUT = "approval_timeout"
    INVALID_REQUEST = "invalid_request"


class SupportReply(Message):
    """What the fleet publishes to `support.replies`: exactly once per turn, and once for a request it refuses
    (outcome `invalid_request`, no turn: `turn_id` is empty and `reason` says why)."""

    request_id: str
    conversation_id: str
    customer_id: str
    turn_id: str
    text: str = Field(description="The answer shown to the customer")
    outcome: Outcome
    steps: int = Field(description="Model calls the turn made")
    usage: Usage
    cost_usd: float = Field(description="What the turn's model calls cost, from the configured price table")
    trace_id: str = Field(description="W3C trace id of the turn (find it in Jaeger)")
    reason: str | None = Field(
        None, description="Why the request was not served (outcome invalid_request); null otherwise"
    )
    metadata: dict[str, JsonValue] | None = Field(None, description="The request's metadata, as it came")


class TurnState(StrEnum):
    """Where a turn that has not been answered yet stands (SupportStatus.state)."""

    WORKING = "working"
    WAITING_FOR_APPROVAL = "waiting_for_approval"


class SupportStatus(Message):
    """What the fleet publishes to `support.status` while a turn is under way: never its reply, which comes once, on
    `support.replies`. `working` as each step of the turn starts (with what the customer may read of it), and
    `waiting_for_approval` when a call waits for a person. At least once (the same state of a turn may come twice); a
    status read after its turn's reply is stale."""

    request_id: str
    conversation_id: str
    customer_id: str
    turn_id: str
    state: TurnState = Field(
        description="working: step `step` of the turn starts (its model call, after the tools named in `activity` "
        "ran); waiting_for_approval: a call waits for a person; the reply comes once they decide, or by `until` at "
        "the latest"
    )
    step: int = Field(0, ge=0, description="working: the turn's model call that starts (1-based); 0 otherwise")
    activity: str = Field(
        "",
        description="working: what the customer may read of the step, in the agent's words for the tools it runs "
        '("Looking up your order"); empty when the agent declares none',
    )
    until: float = Field(0.0, description="waiting_for_approval: Unix time the wait ends at the latest (its deadline)")
    at: float = Field(description="Unix time the fleet entered this state")
    reason: str = Field("", description="Why, in the agent's words (the rule that asks for a person)")
    approval_id: str = Field("", description="The approval a person decides (roundtrip approvals)")
    trace_id: str = Field(description="W3C trace id of the turn")
    metadata: dict[str, JsonValue] | None = Field(None, description="The request's metadata, as it came")


class StreamedText(Message):
    """What the fleet publishes to `support.stream` for a turn that streams: the text of each model call (a step) as
    the model writes it, in chunks, keyed by the conversation. Never the reply, which comes once, on
    `support.replies`: when it arrives, it replaces whatever was shown. Each attempt of a step's call is a stream of its
    own (`stream_id`); its chunks are numbered from 0 (`sequence`), and a chunk may come twice (same turn, step,
    stream and sequence: show it once). A stream ends with a chunk that says `final` (the call completed; `tool_use`:
    the step goes on to tools, so its text is not the answer) or one that says `cut` (discard what was shown of it)."""

    request_id: str
    conversation_id: str
    customer_id: str
    turn_id: str
    step: int = Field(
        ge=0, description="The model call of the turn (1-based) the text belongs to; 0 in a cut of the whole turn"
    )
    stream_id: str = Field(
        description="One attempt of the step's call; empty in a cut: every stream of that step (of every step: step 0)"
    )
    sequence: int = Field(ge=0, description="The chunk's place in its stream, from 0")
    text: str = Field("", description="Text the model wrote since the stream's previous chunk")
    final: bool = Field(False, description="The stream's last chunk: the call completed")
    tool_use: bool = Field(False, description="With final: the call ended in tool_use (the turn goes on to tools)")
    cut: bool = Field(
        False,
        description="The stream was cut (the service died, the call was retried after a 429/529 or an error, the "
        "guard ended the turn otherwise): discard what was shown of it",
    )
    trace_id: str = Field("", description="W3C trace id of the turn")


class Turn(Message):
    """Identity and principal of one turn; copied into every internal message."""

    turn_id: str
    request_id: str
    conversation_id: str
    customer_id: str = Field(description="Principal, from the request envelope only")
    persona: str | None = None
    trace_id: str = Field("", description="W3C trace id of the turn's trace")
    span_id: str = Field(
        "", description="Id of the turn span, the root of that trace (recorded by the gateway at the reply)"
    )
    started_at: float = Field(0.0, description="Unix time the gateway received the request: the start of the turn span")
    deadline_at: float = Field(
        0.0, description="Unix time after which the turn may cause nothing more (set by the guard)"
    )
    history_messages: int = Field(
        0,
        ge=0,
        description="Messages of the conversation's earlier turns at the head of the transcript (set by the guard)",
    )
    disable_parallel_tool_use: bool | None = Field(
        None, description="The request's override of the deployment's setting"
    )
    stream: bool | None = Field(
        None, description="The request's `stream`: its text to support.stream (null: the setting)"
    )
    lane: Literal["interactive", "batch"] = Field("interactive", description="How the turn's model calls are made")
    metadata: dict[str, Any] | None = Field(
        None, description="The request's metadata (the app's own facts), as it came"
    )
    agent_digest: str = Field(
        "", description="Digest of the agent (its prompt and tools) the turn was started under (set by the guard)"
    )
    agent_version: str = Field(
        "", description="The agent version all of the turn runs on (set by the guard); empty: the default version"
    )

    def addressed(self) -> dict[str, str]:
        """The fields by which an app matches a public event (a reply, a status, streamed text) to its request."""
        return {
            "request_id": self.request_id,
            "conversation_id": self.conversation_id,
            "customer_id": self.customer_id,
            "turn_id": self.turn_id,
            "trace_id": self.trace_id,
        }


class ToolCall(Message):
    """One tool_use block the model emitted, as untrusted input."""

    id: str
    name: str
    input: Any
    fingerprint: str = Field(description="tool name + hash of the canonical JSON of the input")
    error: str | None = Field(
        None, description="Why the input was not kept (too large or too deep): the call becomes an is_error result"
    )


class StartTurn(Message):
    """Command: register a new turn with the guard, which makes its first model call."""

    turn: Turn
    text: str


class CancelTurn(Message):
    """Command (operators): end a running turn now, politely. Its customer and conversation must be the ones the
    ledger recorded for the turn, else the cancel is refused (dead-lettered)."""

    turn_id: str
    customer_id: str = Field("", description="The turn's customer, as the ledger recorded it")
    conversation_id: str = Field("", description="The turn's conversation, as the ledger recorded it")
    reason: str = "cancelled by an operator"
    requested_by: str = Field("", description="Who asked: the console's signed-in person or the operator's CLI")


class CallModel(Message):
    """Command: make the next model call of a turn with this transcript."""

    turn: Turn
    step: int = Field(description="Model calls already made in this turn")
    messages: list[dict[str, Any]] = Field(description="Anthropic MessageParam list: the whole transcript")
    spent: Usage = Field(default_factory=Usage, description="Tokens spent by the turn so far")


class ModelResponded(Message):
    """Event: one loop iteration, i.e. one model response."""

    turn: Turn
    step: int = Field(description="1-based number of this model call in the turn")
    messages: list[dict[str, Any]] = Field(description="Transcript sent to the model (without this response)")
    content: list[dict[str, Any]] = Field(default_factory=list, description="The response's content blocks")
    stop_reason: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage, description="Tokens of this call")
    spent: Usage = Field(default_factory=Usage, description="Tokens of the turn, this call included")
    model: str = ""
    error: str | None = Field(None, description="Set when the call failed (after the retries its error allows)")
    busy: bool = Field(
        False, description="The error is the API's capacity: refused (429, 529) until the turn's deadline"
    )
    batch_id: str = Field(
        "", description="The Message Batch that answered this call (priced at the batch rate); empty: a direct call"
    )


class CheckToolCalls(Message):
    """Command: validate and authorize the tool calls of one step."""

    turn: Turn
    step: int
    messages: list[dict[str, Any]] = Field(description="Transcript including the assistant message with the calls")
    calls: list[ToolCall]
    spent: Usage = Field(default_factory=Usage)
    blocked: dict[str, str] = Field(
        default_factory=dict, description="tool_use id -> why the guard refuses to run it (a repeat of a failed call)"
    )
    results: list[dict[str, Any]] = Field(
        default_factory=list,
        description="tool_result blocks of this step's calls that already ran (a step resumed after an approval)",
    )
    decisions: list[ApprovalDecided] = Field(
        default_factory=list, description="Signed approvals by a person that the held calls of this step run under"
    )


class ApprovalHold(Message):
    """Why a call the gate would run waits for a person first, and what the person is shown."""

    reason: str = Field(description="The tool pack's rule that asks for a person, in words")
    entities: dict[str, Any] = Field(
        default_factory=dict, description="Referenced entities as resolved for the principal ({field: entity})"
    )
    input_sha256: str = Field(description="SHA-256 of the canonical JSON of {name, input}: what an approval binds")
    expires_at: float = Field(
        description="Unix time after which the turn ends without the call (the approval deadline)"
    )
    key_id: str = Field("", description="The gate's batch signing key that signed this hold")
    signature: str = Field(
        "",
        description=(
            "The gate's Ed25519 signature (hex) of the hold as the ApprovalRequested shows it (docs/approvals.md): "
            "approval id, turn, step, call, reason, entities, deadline, transcript, earlier results and the ids of "
            "the batch's other calls"
        ),
    )


class CheckedCall(Message):
    id: str
    name: str
    input: Any
    approved: bool
    error: str | None = Field(None, description="Why the call was rejected (becomes an is_error tool_result)")
    hold: ApprovalHold | None = Field(None, description="Set when the call may run only once a person approves it")
    approved_by: str | None = Field(None, description="The person whose signed approval this call runs under")


class ExecuteToolBatch(Message):
    """Command: run the approved calls of one step. Signed by the gate."""

    turn: Turn
    step: int
    messages: list[dict[str, Any]]
    calls: list[CheckedCall]
    spent: Usage = Field(default_factory=Usage)
    expires_at: float = Field(0.0, description="Unix time after which the executor must not run the batch (0: never)")
    results: list[dict[str, Any]] = Field(
        default_factory=list, description="tool_result blocks of this step's calls that already ran before an approval"
    )
    key_id: str = ""
    signature: str = ""


class ApprovalRequested(Message):
    """Event (operators, and the guard, which records the turn as awaiting): a call waits for a person's decision.

    Decide with `roundtrip approvals approve|deny ID`, or publish an ApprovalDecided to
    turn.approval_decisions (key: the conversation id) signed with a decision key."""

    approval_id: str
    turn: Turn = Field(description="Who asked (customer_id is the principal), the turn and its trace id")
    step: int
    call: CheckedCall = Field(
        description="The call waiting: tool name, tool_use id and the exact input the approval binds"
    )
    reason: str = Field(description="Why a person must decide")
    entities: dict[str, Any] = Field(
        default_factory=dict, description="The referenced entities as resolved for the customer ({field: entity})"
    )
    input_sha256: str = Field(description="SHA-256 of the canonical JSON of {name, input}; a decision must name it")
    requested_at: float
    expires_at: float = Field(description="Unix time the turn ends with a polite reply unless decided")
    messages: list[dict[str, Any]] = Field(description="Transcript including the assistant message with the calls")
    results: list[dict[str, Any]] = Field(
        default_factory=list, description="tool_result blocks of the step's calls that already ran"
    )
    results_before: int = Field(
        0,
        ge=0,
        description=(
            "How many of `results` ran before this batch (the gate signed them word for word); the others are the "
            "results of this batch's other calls, in order, whose tool_use ids the gate signed"
        ),
    )
    spent: Usage = Field(default_factory=Usage)
    hold_key_id: str = Field("", description="The key id of the gate's signature of the hold (copied from the batch)")
    hold_signature: str = Field(
        "",
        description=(
            "The gate's signature of the hold (copied from the batch): the guard records the wait only when it verifies"
            " with ROUNDTRIP_BATCH_VERIFY_KEYS"
        ),
    )


class Decision(StrEnum):
    APPROVE = "approve"
    DENY = "deny"


class ApprovalDecided(Message):
    """Command (people, any Kafka client): approve or deny one waiting call. Publish to turn.approval_decisions,
    keyed by the conversation id, signed: `signature` = hex Ed25519 signature by the decision signing key `key_id`
    of the RFC 8785 canonical JSON of every other field. It binds the exact call: turn, tool_use id and input digest."""

    approval_id: str
    turn_id: str
    tool_use_id: str
    input_sha256: str = Field(description="The input_sha256 of the ApprovalRequested: the arguments the person saw")
    decision: Decision
    reason: str = Field("", max_length=2000, description="Why (a denial's reason is shown to the model)")
    decided_by: str = Field(min_length=1, max_length=200, description="Who decided")
    decided_at: float = Field(description="Unix time of the decision")
    key_id: str = ""
    signature: str = ""


class TurnEnded(Message):
    """Event: the guard ended the turn; the gateway turns it into the one reply."""

    turn: Turn
    step: int
    outcome: Outcome
    text: str
    spent: Usage = Field(default_factory=Usage)
    cost_usd: float = 0.0


class TurnFlagged(Message):
    """Event (operators): a turn made no progress for too long; it will be ended after a grace period."""

    turn: Turn
    step: int
    status: str = "stuck"
    idle_s: float
    detail: str


PUBLIC = (SupportRequest, SupportReply, SupportStatus, StreamedText)
INTERNAL = (
    StartTurn,
    CancelTurn,
    CallModel,
    ModelResponded,
    CheckToolCalls,
    ExecuteToolBatch,
    TurnEnded,
    TurnFlagged,
    DeadLettered,
    DeadLetterHandled,
    ApprovalRequested,
    ApprovalDecided,
)

CheckToolCalls.model_rebuild()  # it names ApprovalDecided, defined after it
