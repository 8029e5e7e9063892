"""The fleet's topology, declared once: its services, what each consumes and what it publishes.

Everything that needs to know the shape of the fleet reads it from here: each service's app (its
subscriptions and outlets are checked against its declaration when it is built), `roundtrip up`
(which services to start), the AsyncAPI document (which apps to build), `roundtrip lag` (which
consumer groups there are), `roundtrip topics create` (which topics to make), the health ports
(each service's index) and the ledger check (who shares the turn ledger).

    SERVICES[1]                                  # Service("model", ...)
    service("guard").inputs                      # its subscriptions: topic, message, role (and so its group)
    groups()                                     # {"roundtrip-gateway": "support.requests", ...}
    groups("prod.")                              # {"prod.roundtrip-gateway": "support.requests", ...}
    topic_names()                                # every topic a service reads or writes, plus the dead letters

Adding a subscription (or a service) is one edit here plus its handler; a handler for a
subscription this file does not declare fails when its app is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel

from roundtrip._kernel.wire import events, topics


def group(service: str, role: str | None = None, prefix: str = "") -> str:
    """The consumer group of a service's subscription: `roundtrip-<service>` for its main input,
    `roundtrip-<service>-<role>` for another one; `prefix` (the topic prefix, ROUNDTRIP_TOPIC_PREFIX) comes first, so
    fleets that share a cluster share no group: a rebalance in one never touches another."""
    return f"{prefix}roundtrip-{service}" + (f"-{role}" if role else "")


@dataclass(frozen=True)
class Input:
    """One subscription: a topic a service consumes, in a consumer group of its own.

    `role` None is the service's main input (group `roundtrip-<service>`); any other input names a
    role (group `roundtrip-<service>-<role>`), so subscriptions join and rebalance independently."""

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
    outputs: dict[str, type[BaseModel]] = field(default_factory=dict)  # topic -> the message published there
    # claims, records or counts turns in the turn ledger: needs the fleet's one ledger database
    shares_ledger: bool = False
    # signs approved tool batches and the holds in them: holds the private ROUNDTRIP_BATCH_SIGNING_KEY (the gate only)
    signs_batches: bool = False
    # checks the gate's signatures (batches, holds): holds the public ROUNDTRIP_BATCH_VERIFY_KEYS, cannot sign
    verifies_batches: bool = False
    # verifies people's signed ApprovalDecided: holds the public ROUNDTRIP_DECISION_VERIFY_KEYS, cannot sign
    accepts_decisions: bool = False
    # signs people's ApprovalDecided for them: holds the private ROUNDTRIP_DECISION_SIGNING_KEY (the console)
    signs_decisions: bool = False
    # topics it reads without a consumer group (partitions assigned, read from their start or near their end)
    reads: tuple[str, ...] = ()
    # re-drives dead letters: publishes a dead letter's original record, unchanged, to its source topic, which may be
    # any topic a service of the fleet consumes (`redrive_topics()`)
    redrives: bool = False
    app: str = ""  # module with `build(settings, agent) -> FastStream`; default roundtrip._<name>.app

    @property
    def app_module(self) -> str:
        return self.app or f"roundtrip._{self.name}.app"

    @property
    def keys(self) -> tuple[str, ...]:
        """The key settings this service holds (roundtrip._kernel.settings.KEY_SETTINGS), by its roles: no other."""
        roles = (
            (self.signs_batches, "batch_signing_key"),
            (self.verifies_batches, "batch_verify_keys"),
            (self.signs_decisions, "decision_signing_key"),
            (self.accepts_decisions, "decision_verify_keys"),
        )
        return tuple(name for holds, name in roles if holds)

    def input(self, topic: str, role: str | None = None) -> Input:
        for declared in self.inputs:
            if declared.topic == topic and declared.role == role:
                return declared
        raise LookupError(
            f"the topology declares no subscription of {self.name} to {topic}"
            + (f" as {role!r}" if role else "")
            + " (services/_kernel/wire/topology.py)"
        )

    def output(self, topic: str, message: type[BaseModel]) -> None:
        """LookupError unless this service is declared to publish `message` to `topic`."""
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
        shares_ledger=True,  # reads it: the turns waiting for the model's capacity (services/_gateway/throttle.py)
    ),
    Service(
        "model",
        "calls the model, one iteration event per response",
        inputs=(Input(topics.MODEL_CALLS, events.CallModel),),
        outputs={topics.ITERATIONS: events.ModelResponded, topics.SUPPORT_STREAM: events.StreamedText},
        shares_ledger=True,
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
            topics.SUPPORT_STREAM: events.StreamedText,  # a cut of the turn's text when it ends otherwise
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
        shares_ledger=True,  # reads it: each turn's principal as recorded at its start, which it authorizes for
        signs_batches=True,
        accepts_decisions=True,  # a decided call's batch is signed only with a person's valid decision
    ),
    Service(
        "executor",
        "runs the approved calls of a step, makes the next model call",
        inputs=(Input(topics.TOOL_BATCHES, events.ExecuteToolBatch),),
        outputs={topics.MODEL_CALLS: events.CallModel, topics.APPROVAL_REQUESTS: events.ApprovalRequested},
        shares_ledger=True,
        verifies_batches=True,  # checks the gate's signature before it runs anything
    ),
    Service(
        "console",
        "the web page where people decide held calls and watch turns (services/_console/)",
        inputs=(),  # it reads the ledger, not a topic: what waits and what ended is recorded there
        outputs={
            topics.APPROVAL_DECISIONS: events.ApprovalDecided,
            topics.TURN_CONTROLS: events.CancelTurn,
            topics.DEAD_LETTERS_HANDLED: events.DeadLetterHandled,  # the dead letters re-driven or discarded
        },
        # the dead letters to show, and which of them were handled (by any replica, before any restart)
        reads=(topics.DEAD_LETTERS, topics.DEAD_LETTERS_HANDLED),
        redrives=True,  # an approver re-drives a dead letter to its source topic (services/_console/letters.py)
        shares_ledger=True,  # reads it: the approvals that wait, the turns
        signs_decisions=True,  # signs each decision with the decision signing key; the browser never sees it
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


def groups(prefix: str = "") -> dict[str, str]:
    """Every consumer group of the fleet whose topic prefix is `prefix` -> the (logical) topic it reads."""
    return {i.group(s.name, prefix): i.topic for s in SERVICES for i in s.inputs}


def find_group(name: str, prefix: str = "") -> str | None:
    """The fleet's group a user means by `name`: its full name, or without the prefix, or without `roundtrip-` too
    (`executor`, `roundtrip-executor` and `prod.roundtrip-executor` in the fleet of prefix `prod.`); None if none."""
    known = groups(prefix)
    return next((g for g in (name, prefix + name, f"{prefix}roundtrip-{name}") if g in known), None)


def redrive_topics() -> tuple[str, ...]:
    """The topics a dead letter may be re-driven to: each topic a service of the fleet consumes (a dead letter names
    the topic its record came from; no other topic is ever written from one)."""
    return tuple(dict.fromkeys(i.topic for s in SERVICES for i in s.inputs))


def topic_names() -> tuple[str, ...]:
    """Every topic of the fleet, what `roundtrip topics create` makes: each topic a service reads or writes (in
    the order this file first names it), then the dead letters, which every service may write."""
    used = [i.topic for s in SERVICES for i in s.inputs] + [t for s in SERVICES for t in s.outputs]
    return (*dict.fromkeys(used), topics.DEAD_LETTERS)
