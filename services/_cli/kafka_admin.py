"""`roundtrip topics create|wait` and `acls`: the fleet's topics made or waited for, and the Kafka ACLs each
service's principal needs (derived from the topology)."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from roundtrip._kernel.settings import get_settings
from roundtrip._kernel.wire import topics, topology

FLEET_SERVICES = topology.names()


app = typer.Typer(help="Kafka topics of the fleet.", no_args_is_help=True)

AgentVersions = Annotated[
    list[str] | None,
    typer.Option(help="also each principal of this agent version's model, gate and executor (again for another)"),
]


@app.command("create")
def topics_create(
    partitions: Annotated[int | None, typer.Option(help="partitions per topic (default ROUNDTRIP_PARTITIONS)")] = None,
    executor_partitions: Annotated[int | None, typer.Option(help="partitions of the executor topic")] = None,
    version: Annotated[
        list[str] | None, typer.Option(help="also the own topics of this agent version (again for another)")
    ] = None,
) -> None:
    """Create every topic of the fleet; topics that exist are left alone (or grown to more partitions)."""
    from roundtrip._kernel.kafka.admin import ensure_topics
    from roundtrip._kernel.kafka.clients import kafka_clients
    from roundtrip._kernel.storage.versions import RampRefused, checked_name

    try:
        versions = tuple(checked_name(v) for v in version or ())
    except RampRefused as exc:
        raise typer.BadParameter(str(exc)) from None
    s = get_settings()
    report = asyncio.run(
        ensure_topics(
            kafka_clients(s),
            s.topic_prefix,
            partitions or s.partitions,
            executor_partitions or s.executor_partitions,
            s.replication_factor,
            min_insync_replicas=s.min_insync_replicas,
            versions=versions,
        )
    )
    typer.echo(str(report))
    for name in report.created:
        typer.echo(f"  created {name}")


@app.command("wait")
def topics_wait(
    service: Annotated[str, typer.Argument(help=f"the service whose topics: one of {', '.join(FLEET_SERVICES)}")],
    timeout: Annotated[float, typer.Option(help="seconds to wait before giving up (exit code 1)")] = 600.0,
) -> None:
    """Wait until the topics SERVICE's principal is granted (`roundtrip acls --only SERVICE`) exist and it may see
    them: a service's first step where a setup job, not the service's own user, makes the ACLs and the topics. With
    ROUNDTRIP_AGENT_VERSION (a model, gate or executor of an agent version): that version's own topics."""
    from roundtrip._kernel.kafka.acls import for_service
    from roundtrip._kernel.kafka.admin import wait_for_topics
    from roundtrip._kernel.kafka.clients import kafka_clients

    if service not in FLEET_SERVICES:
        raise typer.BadParameter(f"unknown service {service!r}; choose one of {', '.join(FLEET_SERVICES)}")
    s = get_settings()
    # the shared dead letters of older fleets are read where they exist; nothing makes them any more
    legacy = s.topic_prefix + topics.DEAD_LETTERS
    # an agent version's model, gate or executor: that version's own topics, as its own user is granted them
    version = s.agent_version if service in topology.versioned() else ""
    granted = for_service(topology.service(service), s.topic_prefix, version=version)
    names = [a.name for a in granted if a.kind == "topic" and a.name != legacy]
    away = asyncio.run(wait_for_topics(kafka_clients(s), names, timeout))
    if away:
        why = {3: "no such topic", 29: "not authorized"}
        missing = ", ".join(
            f"{name} ({why.get(code, f'error {code}' if code else 'no leader')})" for name, code in away.items()
        )
        typer.secho(
            f"error: after {timeout:g} s {service} still cannot see {missing}: have the ACLs and the topics been made "
            "(`roundtrip acls --apply` and `roundtrip topics create`; in Kubernetes the roundtrip-kafka-setup Job)?",
            fg="red",
            err=True,
        )
        raise typer.Exit(1)
    typer.echo(f"topics: the {len(names)} of {service} are there")


def acls(
    principal: Annotated[
        str, typer.Option(help="each principal, {name} standing for the service (or operator, app)")
    ] = "User:roundtrip-{name}",
    only: Annotated[
        str | None, typer.Option("--only", help="just this principal's: a service, operator or app")
    ] = None,
    app_group: Annotated[
        str | None, typer.Option(help="also the user's app, reading replies in this consumer group")
    ] = None,
    command_config: Annotated[
        str | None, typer.Option(help="the admin client's properties file, passed on to kafka-acls.sh")
    ] = None,
    apply: Annotated[
        bool,
        typer.Option(
            "--apply",
            help="add them through the admin API instead, and remove what those principals hold beyond them, as "
            "the principal of the ROUNDTRIP_KAFKA_* settings (one allowed to alter ACLs)",
        ),
    ] = False,
    version: AgentVersions = None,
) -> None:
    """Print the Kafka ACLs each service's principal needs, and nothing more (derived from the topology), as
    kafka-acls.sh commands: one principal per service, plus the operator's (these commands) and the app's.
    `--apply` adds them to the cluster instead, and removes what those principals hold beyond them."""
    from roundtrip._kernel.kafka.acls import apply as apply_acls
    from roundtrip._kernel.kafka.acls import derive, prune, render
    from roundtrip._kernel.kafka.clients import kafka_clients

    s = get_settings()
    derived = derive(s.topic_prefix, principal, app_group, tuple(version or ()))
    if only is not None:
        if only not in derived:
            raise typer.BadParameter(f"no principal {only!r}; known: {', '.join(derived)}", param_hint="--only")
        derived = {only: derived[only]}
    if not apply:
        typer.echo(render(derived, s.bootstrap_servers, command_config), nl=False)
        return

    async def add() -> tuple[int, list[str]]:
        admin = kafka_clients(s).admin(client_id="roundtrip-acls")
        await admin.start()
        try:
            return await apply_acls(admin, derived), await prune(admin, derived, s.topic_prefix)
        finally:
            await admin.close()

    try:
        added, removed = asyncio.run(add())
    except ValueError as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"{added} ACL bindings added for {', '.join(derived)} at {s.bootstrap_servers}")
    for line in removed:
        typer.echo(f"removed, beyond what it needs: {line}")
