"""`roundtrip turns`: the turns in the ledger listed with their trace ids (through the kernel's read port), and
`turns cancel`: a turn stopped now."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated

import typer

from roundtrip._cli.fleets import FleetOption, use_fleet
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire import topics

app = typer.Typer(
    help="Turns in the guard's ledger: list them (with trace ids), cancel one.", invoke_without_command=True
)
COLOURS = {
    "running": "cyan",
    "stuck": "red",
    "waiting": "blue",
    "awaiting": "yellow",
    "ending": "magenta",
    "ended": "dim",
    "in batch": "blue",  # a batch turn waiting on its Message Batch (TurnRow.shown_status)
}


@app.callback()
def turns(
    ctx: typer.Context,
    status: Annotated[
        str | None,
        typer.Option(
            help="running, stuck, waiting (a model call waits for the API's rate limits), awaiting (a call waits for "
            "a person's approval), ending (an end waiting for running calls) or ended"
        ),
    ] = None,
    customer: Annotated[str | None, typer.Option(help="only this customer's turns")] = None,
    lane: Annotated[
        str | None,
        typer.Option(help="batch (model calls through Message Batches: `in batch` while one waits) or interactive"),
    ] = None,
    version: Annotated[
        str | None, typer.Option(help="only this agent version's turns (`default`: the default version's)")
    ] = None,
    limit: Annotated[int, typer.Option(help="most recent N turns")] = 30,
    fleet: FleetOption = None,
) -> None:
    """List running, stuck and ended turns with their trace ids (newest first)."""
    from roundtrip._cli.common import fleet_settings

    if ctx.invoked_subcommand is not None:
        use_fleet(fleet)
        return
    if status and status not in ("running", "stuck", "waiting", "awaiting", "ending", "ended"):
        raise typer.BadParameter("status must be running, stuck, waiting, awaiting, ending or ended")
    if lane and lane not in ("batch", "interactive"):
        raise typer.BadParameter("lane must be batch or interactive")
    raise typer.Exit(asyncio.run(list_turns(fleet_settings(fleet), status, customer, limit, lane, version)))


@app.command("cancel")
def turns_cancel(
    turn_id: Annotated[str, typer.Argument(help="the turn to stop")],
    reason: Annotated[str, typer.Option(help="recorded with the turn")] = "cancelled by an operator",
    fleet: FleetOption = None,
) -> None:
    """Stop a running turn now (a kill switch): the customer gets a polite reply."""
    from roundtrip._cli.common import fleet_settings

    raise typer.Exit(asyncio.run(cancel_turn(fleet_settings(fleet), turn_id, reason)))


async def list_turns(
    settings: Settings, status: str | None, customer: str | None, limit: int, lane: str | None, version: str | None
) -> int:
    from rich.table import Table

    from roundtrip._cli.common import console, ledger_missing, plain
    from roundtrip._kernel.storage.ledger_reads import TurnReads
    from roundtrip._kernel.storage.versions import named

    if ledger_missing(settings):
        return 2
    version = named(version) if version is not None else None
    ledger = await TurnReads.open(settings.ledger_db_url, read_only=True)
    try:
        rows = await ledger.list(status=status, customer_id=customer, limit=limit, lane=lane, version=version)
        size = await ledger.size()
    finally:
        await ledger.close()
    table = Table(box=None, pad_edge=False)
    for column in (
        "turn",
        "status",
        "lane",
        "version",
        "customer",
        "step",
        "outcome",
        "cost $",
        "tokens in/out",
        "age s",
        "idle s",
        "trace id",
    ):
        table.add_column(column)
    now = time.time()
    for r in rows:
        idle = "" if r.status == "ended" else f"{now - r.last_progress_at:.0f}"
        table.add_row(
            plain(r.turn_id),
            f"[{COLOURS['in batch' if r.in_batch else r.status]}]{plain(r.shown_status)}[/]",
            plain(r.shown_lane),
            plain(r.shown_version),
            plain(r.customer_id),
            str(r.step),
            plain(r.outcome or ""),
            f"{r.cost_usd:.4f}",
            f"{r.input_tokens + r.cache_creation_input_tokens + r.cache_read_input_tokens}/{r.output_tokens}",
            f"{now - r.started_at:.0f}",
            idle,
            plain(r.trace_id),
        )
    console.print(table if rows else "no turns")
    console.print(f"[dim]{plain(size.line(settings.ledger_retention_s, now))}[/]")
    return 0


async def cancel_turn(settings: Settings, turn_id: str, reason: str) -> int:
    from roundtrip._cli.common import console, ledger_missing, plain
    from roundtrip._console.decisions import cancel_command
    from roundtrip._kernel.database import shown
    from roundtrip._kernel.kafka.clients import kafka_clients
    from roundtrip._kernel.storage.ledger_reads import TurnReads
    from roundtrip._kernel.storage.turnstore import ENDED

    if ledger_missing(settings):
        return 2
    ledger = await TurnReads.open(settings.ledger_db_url, read_only=True)
    try:
        row = await ledger.get(turn_id)
    finally:
        await ledger.close()
    if row is None:
        console.print(f"[red]no turn {plain(turn_id)}[/] in the ledger ({shown(settings.ledger_db_url)})")
        return 1
    if row.status == ENDED:
        console.print(f"turn {plain(turn_id)} already ended ({plain(row.outcome)})")
        return 0
    producer = kafka_clients(settings).producer()
    try:
        await producer.start()
        command = cancel_command(row, reason, "the roundtrip CLI")
        await producer.send_and_wait(
            topics.t(topics.TURN_CONTROLS, settings.topic_prefix),
            command.model_dump_json().encode(),
            key=row.conversation_id.encode(),
        )
    finally:
        await producer.stop()
    console.print(
        f"cancel sent for turn {plain(turn_id)} (customer {plain(row.customer_id)}); the guard ends it with a polite "
        "reply"
    )
    return 0
