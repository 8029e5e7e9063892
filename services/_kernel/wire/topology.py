"""The fleet's topology, declared once: its services, what each consumes and what it publishes.

Every app, `roundtrip up`, the AsyncAPI document, `roundtrip lag`, `roundtrip topics create`, the health ports and
the ledger check read the fleet's shape from here. A handler for a subscription this file does not declare fails when
its app is built, so adding a subscription (or a service) is one edit here plus its handler.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel

from roundtrip._kernel.wire import events, letters, topics


def group(service: str, role: str | None = None, prefix: str = "", version: str = "") -> str:
    """`[prefix]roundtrip-<service>[-<role>][.version.<version>]`: fleets of other prefixes share no group, nor
    rebalances, and each agent version's services are a group of their own."""
    named = f"{prefix}roundtrip-{service}" + (f"-{role}" if role else "")
    return named + topics.VERSION_MARK + version if version else named


@dataclass(frozen=True)
class Input:
    """One subscription, in a consumer group of its own (`role` None: the main input), so each rebalances alone."""

    topic: str
    message: type[BaseModel]
    role: str | None = None

    def group(self, service: str, prefix: str = "") -> str:
        return group(service, self.role, prefix)


@dataclass(frozen=True)
class Service:
    name: str
    summary: str
    inputs: tuple[Input, ...]
    outputs: dict[str, type[BaseModel]] = field(default_factory=dict)
    shares_ledger: bool = False  # needs the fleet's one ledger database
    # the key roles (`keys`): a service holds only its roles' keys; a verifier holds public keys and cannot sign
    signs_batches: bool = False  # the batch signing key (the gate only)
    verifies_batches: bool = False
    accepts_decisions: bool = False  # verifies people's signed ApprovalDecided
    signs_decisions: bool = False  # the decision signing key (the console)
    reads: tuple[str, ...] = ()  # topics it reads without a consumer group
    reads_dead_letters: bool = False  # every service's dead letters, and the shared topic of older fleets
    redrives: bool = False  # publishes a dead letter's record, unchanged, to its source topic (`redrive_topics()`)
    app: str = ""  # module with `build(settings, agent) -> FastStream`; default roundtrip._<name>.app
    versioned: bool = False  # runs one agent version (ROUNDTRIP_AGENT_VERSION), on that version's topics

    @property
    def app_module(self) -> str:
        return self.app or f"roundtrip._{self.name}.app"

    @property
    def dead_letters(self) -> str | None:
        """The topic of its dead letters, which it alone writes; None when it consumes nothing (it cannot refuse)."""
        return topics.dead_letters(self.name) if self.inputs else None

    @property
    def keys(self) -> tuple[str, ...]:
        roles = (
            (self.signs_batches, "batch_signing_key"),
            (self.verifies_batches, "batch_verify_keys"),
            (self.signs_decisions, "decision_signing_key"),
            (self.accepts_decisions, "decision_verify_keys"),
        )
        return tuple(name for holds, name in roles if holds)

    def input(self, topic: str, role: str | None) -> Input:
        for declared in self.inputs:
            if declared.topic == topic and declared.role == role:
                return declared
        raise LookupError(
            f"the topology declares no subscription of {self.name} to {topic}"
            + (f" as {role!r}" if role else "")
            + " (services/_kernel/wire/topology.py)"
        )

    def output(self, topic: str, message: type[BaseModel]) -> None:
        if self.outputs.get(topic) is not message:
            raise LookupError(
                f"the topology declares no output {message.__name__} of {self.name} to {topic} "
                "(services/_kernel/wire/topology.py)"
            )


SERVICES: tuple[Service, ...] = (
    Service(
        "gateway",
        "takes support requests, starts turns, replies",
        inputs=(
            Input(topics.SUPPORT_REQUESTS, events.SupportRequest),
            Input(topics.OUTCOMES, events.TurnEnded, "replies"),
        ),
        outputs={topics.TURN_STARTS: events.StartTurn, topics.SUPPORT_REPLIES: events.SupportReply},
        shares_ledger=True,
    ),
    Service(
        "model",
        "calls the model, one iteration event per response",
        inputs=(Input(topics.MODEL_CALLS, events.CallModel),),
        outputs={topics.ITERATIONS: events.ModelResponded, topics.SUPPORT_STREAM: events.StreamedText},
        shares_ledger=True,
        versioned=True,
    ),
    Service(
        "guard",
        "the gate every iteration passes: continue, finish or drop; stuck turns, approvals",
        inputs=(
            Input(topics.ITERATIONS, events.ModelResponded),
            Input(topics.TURN_STARTS, events.StartTurn, "starts"),
            Input(topics.TURN_CONTROLS, events.CancelTurn, "controls"),
            Input(topics.APPROVAL_REQUESTS, events.ApprovalRequested, "approvals"),
            Input(topics.APPROVAL_DECISIONS, events.ApprovalDecided, "decisions"),
        ),
        outputs={
            topics.MODEL_CALLS: events.CallModel,
            topics.TOOL_CALLS: events.CheckToolCalls,
            topics.OUTCOMES: events.TurnEnded,
            topics.TURN_EVENTS: events.TurnFlagged,
            topics.SUPPORT_STATUS: events.SupportStatus,
            topics.SUPPORT_STREAM: events.StreamedText,
        },
        shares_ledger=True,
        accepts_decisions=True,  # a person's decision resumes the turn waiting for it
        verifies_batches=True,  # records a wait only under the gate's signature of the hold
    ),
    Service(
        "gate",
        "validates and authorizes each tool call, signs the approved batch",
        inputs=(Input(topics.TOOL_CALLS, events.CheckToolCalls),),
        outputs={topics.TOOL_BATCHES: events.ExecuteToolBatch},
        shares_ledger=True,
        versioned=True,
        signs_batches=True,
        accepts_decisions=True,  # a decided call's batch is signed only with a person's valid decision
    ),
    Service(
        "executor",
        "runs the approved calls of a step, makes the next model call",
        inputs=(Input(topics.TOOL_BATCHES, events.ExecuteToolBatch),),
        outputs={topics.MODEL_CALLS: events.CallModel, topics.APPROVAL_REQUESTS: events.ApprovalRequested},
        shares_ledger=True,
        versioned=True,
        verifies_batches=True,  # checks the gate's signature before it runs anything
    ),
    Service(
        "console",
        "the web page where people decide held calls and watch turns (services/_console/)",
        inputs=(),
        outputs={
            topics.APPROVAL_DECISIONS: events.ApprovalDecided,
            topics.TURN_CONTROLS: events.CancelTurn,
            topics.DEAD_LETTERS_HANDLED: letters.DeadLetterHandled,
        },
        reads=(topics.DEAD_LETTERS_HANDLED,),
        reads_dead_letters=True,
        redrives=True,
        shares_ledger=True,
        signs_decisions=True,  # the browser never sees the key
    ),
)


def names() -> tuple[str, ...]:
    """The fleet's services, in the order `roundtrip up` starts them (and their health-port index)."""
    return tuple(s.name for s in SERVICES)


def service(name: str) -> Service:
    for declared in SERVICES:
        if declared.name == name:
            return declared
    raise LookupError(f"no service {name!r} in the topology; the fleet's services are {', '.join(names())}")


def index(name: str) -> int:
    """The service's place in the fleet (its offset from ROUNDTRIP_HEALTH_PORT when each takes its own)."""
    return names().index(name)


def groups(prefix: str) -> dict[str, str]:
    return {i.group(s.name, prefix): i.topic for s in SERVICES for i in s.inputs}


def find_group(name: str, prefix: str) -> str | None:
    """The fleet's group a user means by `name`, with or without the prefix and `roundtrip-`; None if none."""
    known = groups(prefix)
    return next((g for g in (name, prefix + name, f"{prefix}roundtrip-{name}") if g in known), None)


def redrive_topics() -> tuple[str, ...]:
    """The topics a dead letter may be re-driven to: those the fleet consumes, and no other."""
    return tuple(dict.fromkeys(i.topic for s in SERVICES for i in s.inputs))


def consumed_by(service_name: str) -> tuple[str, ...]:
    """The topics a service consumes: the only ones its dead letters may name as their source."""
    return tuple(dict.fromkeys(i.topic for s in SERVICES if s.name == service_name for i in s.inputs))


def dead_letter_topics() -> tuple[str, ...]:
    """Each consuming service's dead letters, in the services' order (the shared topic of older fleets is not one)."""
    return tuple(s.dead_letters for s in SERVICES if s.dead_letters)


def topic_names() -> tuple[str, ...]:
    """Every topic a service reads or writes, in the order first named here, then the dead letters."""
    used = [i.topic for s in SERVICES for i in s.inputs] + [t for s in SERVICES for t in s.outputs]
    return (*dict.fromkeys(used), *dead_letter_topics())


def versioned() -> tuple[str, ...]:
    """The services each agent version runs of its own (the guard, the gateway and the console are shared)."""
    return tuple(s.name for s in SERVICES if s.versioned)


def _versioned_topics() -> tuple[str, ...]:
    """The topics only versioned services read: each agent version has its own copy of them."""
    shared = {i.topic for s in SERVICES if not s.versioned for i in s.inputs}
    return tuple(dict.fromkeys(i.topic for s in SERVICES if s.versioned for i in s.inputs if i.topic not in shared))


VERSIONED = _versioned_topics()


def of_version(name: str, version: str) -> str:
    """`name` as agent version `version` reads it: the default version ("") keeps today's names, as do the shared."""
    return f"{name}{topics.VERSION_MARK}{version}" if version and name in VERSIONED else name


def version_topics(version: str) -> tuple[str, ...]:
    """The topics agent version `version` has of its own (none for the default version: it reads today's)."""
    return tuple(of_version(t, version) for t in VERSIONED) if version else ()
