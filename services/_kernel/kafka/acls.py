"""Least privilege on the cluster: the ACLs each service's principal needs, derived from the topology.

Each service runs as its own principal: Read on its inputs and groups, Write on its outputs and its own dead letters,
and what its role adds (the gateway's transactional ids), so a compromised executor can write nothing but model calls,
approval requests and its dead letters. Every name carries the fleet's topic prefix, so two fleets on one cluster
grant each other nothing. `render` prints `kafka-acls.sh` commands, `apply` adds them by the admin API and `prune`
removes what a principal of the fleet holds beyond them (an older version's grant), so an upgrade narrows as it goes.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from roundtrip._kernel.wire import topics, topology

DEFAULT_PRINCIPAL = "User:roundtrip-{name}"
# Kafka's ResourceType, AclOperation, PatternType and AclPermissionType codes
RESOURCE_CODES = {"topic": 2, "group": 3, "cluster": 4, "transactional-id": 5}
OPERATION_CODES = {
    "Read": 3,
    "Write": 4,
    "Create": 5,
    "Alter": 7,
    "Describe": 8,
    "DescribeConfigs": 10,
    "AlterConfigs": 11,
    "IdempotentWrite": 12,
}
ANY, LITERAL, PREFIXED, ALLOW = 1, 3, 4, 3
# (resource type, resource name, pattern type, operation, permission type, host) of one binding on the cluster
Binding = tuple[int, str, int, int, int, str]
OPERATOR, APP = "operator", "app"


@dataclass(frozen=True, order=True)
class Acl:
    principal: str
    kind: str
    name: str
    operations: tuple[str, ...]
    prefixed: bool = False

    def command(self, bootstrap: str, command_config: str | None) -> str:
        parts = ["kafka-acls.sh", "--bootstrap-server", bootstrap]
        if command_config:
            parts += ["--command-config", command_config]
        parts += ["--add", "--allow-principal", self.principal]
        for operation in self.operations:
            parts += ["--operation", operation]
        parts += ["--cluster"] if self.kind == "cluster" else [f"--{self.kind}", self.name]
        if self.prefixed:
            parts += ["--resource-pattern-type", "prefixed"]
        return shlex.join(parts)


def _topic(principal: str, name: str, prefix: str, *operations: str) -> Acl:
    return Acl(principal, "topic", topics.t(name, prefix), (*operations, "Describe"))


def for_service(
    service: topology.Service, prefix: str, principal: str = DEFAULT_PRINCIPAL, version: str = ""
) -> list[Acl]:
    """`version`: the principal of that agent version's own service (`roundtrip-model-v2`), on its own topics."""
    who = principal.format(name=f"{service.name}-{version}" if version else service.name)
    acls = [_topic(who, topology.of_version(i.topic, version), prefix, "Read") for i in service.inputs]
    acls += [
        Acl(who, "group", topology.group(service.name, i.role, prefix, version), ("Read",)) for i in service.inputs
    ]
    acls += [_topic(who, topology.of_version(t, version), prefix, "Write") for t in service.outputs]
    if service.dead_letters:  # its own only: a letter on another service's topic was not written by this one
        acls.append(_topic(who, service.dead_letters, prefix, "Write"))
    acls += [_topic(who, t, prefix, "Read") for t in service.reads]
    if service.reads_dead_letters:
        acls += [_topic(who, t, prefix, "Read") for t in (*topology.dead_letter_topics(), topics.DEAD_LETTERS)]
    if service.redrives:  # reads the original record back, and publishes it only if the letter's copy is the same
        acls += [_topic(who, t, prefix, "Read", "Write") for t in topology.redrive_topics()]
    acls.append(Acl(who, "cluster", "kafka-cluster", ("IdempotentWrite",)))
    if service.name == "gateway":
        acls.append(_topic(who, topics.SUPPORT_REPLIES, prefix, "Read"))
        acls.append(Acl(who, "transactional-id", f"{prefix}roundtrip-gateway-", ("Write", "Describe"), prefixed=True))
    if service.name == "guard":  # its ledger's retention must outlast the requests topic's retention.ms
        acls.append(_topic(who, topics.SUPPORT_REQUESTS, prefix, "DescribeConfigs"))
    return _merged(acls)


def for_operator(prefix: str, principal: str, versions: tuple[str, ...]) -> list[Acl]:
    """The `roundtrip` commands: make and grow the topics (each agent version's in `versions` too), read them all,
    publish requests, cancels, decisions."""
    who = principal.format(name=OPERATOR)
    acls = [
        Acl(
            who,
            "topic",
            topics.t(name, prefix),
            ("Read", "Describe", "DescribeConfigs", "AlterConfigs", "Alter", "Create"),
        )
        for name in (*topology.topic_names(), *(t for v in versions for t in topology.version_topics(v)))
    ]
    acls.append(_topic(who, topics.DEAD_LETTERS, prefix, "Read"))  # `roundtrip dead-letters` of an older fleet
    acls += [
        _topic(who, name, prefix, "Write")
        for name in (topics.SUPPORT_REQUESTS, topics.TURN_CONTROLS, topics.APPROVAL_DECISIONS)
    ]
    acls.append(Acl(who, "group", f"{prefix}roundtrip-", ("Describe",), prefixed=True))
    acls.append(Acl(who, "cluster", "kafka-cluster", ("Create", "Describe", "IdempotentWrite")))
    return _merged(acls)


def for_app(group: str, prefix: str, principal: str) -> list[Acl]:
    """The user's app: publish requests, read replies, status and stream in its own consumer group `group`."""
    who = principal.format(name=APP)
    return _merged(
        [
            _topic(who, topics.SUPPORT_REQUESTS, prefix, "Write"),
            _topic(who, topics.SUPPORT_REPLIES, prefix, "Read"),
            _topic(who, topics.SUPPORT_STATUS, prefix, "Read"),
            _topic(who, topics.SUPPORT_STREAM, prefix, "Read"),
            Acl(who, "group", group, ("Read",)),
            Acl(who, "cluster", "kafka-cluster", ("IdempotentWrite",)),
        ]
    )


def derive(prefix: str, principal: str, app_group: str | None, versions: tuple[str, ...]) -> dict[str, list[Acl]]:
    """Each principal's ACLs; with `versions`, each agent version's own services too, and the guard may write their
    model calls and tool checks."""
    derived = {s.name: for_service(s, prefix, principal) for s in topology.SERVICES}
    guard = principal.format(name="guard")
    writes = [t for t in topology.service("guard").outputs if t in topology.VERSIONED]
    for version in versions:
        for service in (s for s in topology.SERVICES if s.versioned):
            derived[f"{service.name}-{version}"] = for_service(service, prefix, principal, version)
        routed = [_topic(guard, topology.of_version(t, version), prefix, "Write") for t in writes]
        derived["guard"] = _merged([*derived["guard"], *routed])
    derived[OPERATOR] = for_operator(prefix, principal, versions)
    if app_group:
        derived[APP] = for_app(app_group, prefix, principal)
    return derived


def render(derived: dict[str, list[Acl]], bootstrap: str, command_config: str | None = None) -> str:
    lines: list[str] = []
    for name, acls in derived.items():
        lines.append(f"# {name}: {acls[0].principal}" if acls else f"# {name}")
        lines += [acl.command(bootstrap, command_config) for acl in acls]
    return "\n".join(lines) + "\n"


async def apply(admin: Any, derived: dict[str, list[Acl]]) -> int:
    """Add every ACL through a started admin client, one binding per request; returns how many. Raises ValueError
    naming the first binding the cluster refused."""
    from aiokafka.protocol.admin import CreateAclsRequest

    added = 0
    for acl in (a for acls in derived.values() for a in acls):
        for operation in acl.operations:
            request = CreateAclsRequest(
                RESOURCE_CODES[acl.kind],
                acl.name,
                PREFIXED if acl.prefixed else LITERAL,
                acl.principal,
                "*",
                OPERATION_CODES[operation],
                ALLOW,
            )
            response = await admin._send_request(request)  # aiokafka's admin has no create_acls of its own
            for error_code, error_message in response.creation_responses:
                if error_code:
                    raise ValueError(
                        f"the cluster refused {operation} on {acl.kind} {acl.name} for {acl.principal}: "
                        f"error {error_code} {error_message or ''}".strip()
                    )
            added += 1
    return added


def bindings(acls: list[Acl]) -> set[Binding]:
    """The cluster's bindings `acls` stand for: one per operation, allowed from any host."""
    return {
        (RESOURCE_CODES[a.kind], a.name, PREFIXED if a.prefixed else LITERAL, OPERATION_CODES[op], ALLOW, "*")
        for a in acls
        for op in a.operations
    }


async def held(admin: Any, principal: str) -> set[Binding]:
    """Every binding the cluster holds for `principal`."""
    from aiokafka.protocol.admin import DescribeAclsRequest

    response = await admin._send_request(DescribeAclsRequest(ANY, None, ANY, principal, None, ANY, ANY))
    if response.error_code:
        raise ValueError(f"the cluster refused to describe the ACLs of {principal}: error {response.error_code}")
    return {
        (kind, name, pattern, operation, permission, host)
        for kind, name, pattern, acls in response.resources
        for who, host, operation, permission in acls
        if who == principal
    }


async def prune(admin: Any, derived: dict[str, list[Acl]], prefix: str) -> list[str]:
    """Remove every binding a principal of `derived` holds beyond its own on a resource named with the fleet's
    `prefix`; returns them, one line each. Principals outside the fleet, and another fleet's names granted to the same
    principal, are not touched."""
    from aiokafka.protocol.admin import DeleteAclsRequest

    removed = []
    for acls in derived.values():
        if not acls:
            continue
        principal = acls[0].principal
        beyond = sorted(b for b in await held(admin, principal) - bindings(acls) if b[1].startswith(prefix))
        for kind, name, pattern, operation, permission, host in beyond:
            request = DeleteAclsRequest(kind, name, pattern, principal, host, operation, permission)
            response = await admin._send_request(request)
            for error_code, error_message, _matching in response.filter_responses:
                if error_code:
                    raise ValueError(f"the cluster refused to remove an ACL of {principal} on {name}: {error_message}")
            removed.append(f"{principal}: {_name(OPERATION_CODES, operation)} on {_name(RESOURCE_CODES, kind)} {name}")
    return removed


def _name(codes: dict[str, int], code: int) -> str:
    return next((name for name, c in codes.items() if c == code), str(code))


def _merged(acls: list[Acl]) -> list[Acl]:
    by_resource: dict[tuple[str, str, str, bool], list[str]] = {}
    for acl in acls:
        ops = by_resource.setdefault((acl.principal, acl.kind, acl.name, acl.prefixed), [])
        ops += [op for op in acl.operations if op not in ops]
    return [Acl(who, kind, name, tuple(ops), prefixed) for (who, kind, name, prefixed), ops in by_resource.items()]
