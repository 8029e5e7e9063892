"""`roundtrip versions`: the agent versions side by side, each with its share of new conversations, its running turns
and how its turns ended; `versions ramp` sets a version's share (its topics made first), `versions drain` sends it no
turn from now on (docs/decisions/agent-versions.md)."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Annotated

import typer

from roundtrip._cli.fleets import FleetOption, use_fleet
from roundtrip._kernel.settings import Settings

if TYPE_CHECKING:
    from roundtrip._kernel.storage.versions import Versions

DRAIN_POLL_S = 2.0
DRAIN_SETTLE_S = 3.0  # more than a guard keeps the ramp it read (REFRESH_S) and a start takes

app = typer.Typer(
    help="Agent versions side by side: each one's share of new conversations, running turns and outcomes; ramp one "
    "up or down, drain one.",
    invoke_without_command=True,
)


@app.callback()
def versions(ctx: typer.Context, fleet: FleetOption = None) -> None:
    """Each agent version: its share of new conversations, its running turns, how its turns ended."""
    from roundtrip._cli.common import fleet_settings

    if ctx.invoked_subcommand is not None:
        use_fleet(fleet)
        return
    raise typer.Exit(asyncio.run(show(fleet_settings(fleet))))


@app.command("ramp")
def ramp(
    version: Annotated[str, typer.Argument(help="the version (its services run with ROUNDTRIP_AGENT_VERSION)")],
    share: Annotated[str, typer.Argument(help="its percent of new conversations, `10%` or `10`")],
    fleet: FleetOption = None,
) -> None:
    """Send this share of new conversations to a version from now on; a conversation keeps its first turn's version."""
    from roundtrip._cli.common import fleet_settings

    raise typer.Exit(asyncio.run(set_share(fleet_settings(fleet), version, percent(share))))


@app.command("drain")
def drain(
    version: Annotated[str, typer.Argument(help="the version to take out of service (`default`: the default version)")],
    wait: Annotated[bool, typer.Option(help="wait until none of its turns runs")] = True,
    timeout: Annotated[
        float,
        typer.Option(help="seconds to wait at most; then exit 1 if its turns still run (0: as long as they run)"),
    ] = 0.0,
    fleet: FleetOption = None,
) -> None:
    """Send a version no new turn from now on (its conversations move on to where the ramp sends a new one), then wait
    until none of its turns runs (its running turns end on it) and say that its model, gate and executor may stop."""
    from roundtrip._cli.common import fleet_settings

    raise typer.Exit(asyncio.run(drain_version(fleet_settings(fleet), version, wait, timeout)))


def percent(text: str) -> float:
    try:
        return float(text.strip().removesuffix("%"))
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a percent (10% or 10)") from None


def name(version: str) -> str:
    from roundtrip._kernel.storage.versions import shown

    return shown(version)


async def show(settings: Settings) -> int:
    from rich.table import Table

    from roundtrip._cli.common import console, ledger_missing, plain
    from roundtrip._kernel.storage.versions import COLUMNS, Versions

    if ledger_missing(settings):
        return 2
    store = await Versions.open(settings.ledger_db_url, read_only=True)
    try:
        rows = await store.summary()
    finally:
        await store.close()
    table = Table(box=None, pad_edge=False)
    for column in COLUMNS:
        table.add_column(column)
    for row in rows:
        draining = " [yellow](draining)[/]" if row.draining else ""
        table.add_row(plain(name(row.version)) + draining, *(plain(cell) for cell in row.cells()))
    console.print(table)
    console.print(
        "[dim]per ended turn: mean steps (model calls), cost, approvals asked; p50: the median ended turn's seconds "
        "from its start to its end[/]"
    )
    return 0


async def set_share(settings: Settings, version: str, share: float) -> int:
    from roundtrip._cli.common import console, ledger_missing, plain
    from roundtrip._kernel.kafka.admin import ensure_topics
    from roundtrip._kernel.kafka.clients import kafka_clients
    from roundtrip._kernel.storage.versions import RampRefused, Versions, checked_name, checked_share

    if ledger_missing(settings):
        return 2
    try:
        checked_name(version)
        checked_share(share)
    except RampRefused as exc:
        console.print(f"[red]error:[/] {plain(exc)}")
        return 1
    # its topics before its first turn: the guard never routes a turn to a topic that is not there
    await ensure_topics(
        kafka_clients(settings),
        settings.topic_prefix,
        settings.partitions,
        settings.executor_partitions,
        settings.replication_factor,
        min_insync_replicas=settings.min_insync_replicas,
        versions=(version,),
    )
    store = await Versions.open(settings.ledger_db_url)
    try:
        shares = await store.ramp(version, share)
    except RampRefused as exc:
        console.print(f"[red]error:[/] {plain(exc)}")
        return 1
    finally:
        await store.close()
    rest = max(0.0, 100 - sum(shares.values()))
    said = ", ".join(f"{plain(v)} {s:g} %" for v, s in sorted(shares.items()) if s)
    console.print(f"new conversations: {said or 'none to a named version'}; the default version {rest:g} %")
    return 0


async def drain_version(settings: Settings, version: str, wait: bool, timeout: float) -> int:
    from roundtrip._cli.common import console, ledger_missing, plain
    from roundtrip._kernel.storage.versions import DEFAULT, DEFAULT_WORD, RampRefused, Versions

    if ledger_missing(settings):
        return 2
    version = DEFAULT if version == DEFAULT_WORD else version
    store = await Versions.open(settings.ledger_db_url)
    try:
        await store.drain(version)
        since = time.monotonic()
        running, told = await _running(store, version), -1
        # a guard that read the ramp just before the drain may still start a turn on it: none counts until it read it
        while wait and (running or time.monotonic() - since < DRAIN_SETTLE_S):
            if timeout and running and time.monotonic() - since >= timeout:
                break
            if running and running != told:
                console.print(f"{plain(name(version))} drains: {running} of its turns still run")
                told = running
            await asyncio.sleep(DRAIN_POLL_S)  # its turns end by their deadline at the latest
            running = await _running(store, version)
    except RampRefused as exc:
        console.print(f"[red]error:[/] {plain(exc)}")
        return 1
    finally:
        await store.close()
    said = plain(name(version))
    if running and wait:
        console.print(
            f"[red]error:[/] {said} drains: {running} of its turns still run after {timeout:g} s: its model, gate and "
            f"executor must not stop yet (`roundtrip versions drain {plain(version or DEFAULT_WORD)}` waits again)"
        )
        return 1
    if running:
        console.print(f"{said} drains: {running} of its turns still run; its services may stop once none does")
    else:
        console.print(f"{said} runs no turn and gets none: its model, gate and executor may stop")
    return 0


async def _running(store: Versions, version: str) -> int:
    return await store.running(version)
