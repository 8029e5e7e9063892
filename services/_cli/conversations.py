"""`roundtrip conversations`: the conversations listed with their history (through the kernel's read port), and
`conversations forget`: one erased now."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated

import typer

from roundtrip._cli.fleets import FleetOption, use_fleet
from roundtrip._kernel.settings import Settings

app = typer.Typer(
    help="Conversations in the guard's store: list them, forget one (erasure).", invoke_without_command=True
)


@app.callback()
def conversations(
    ctx: typer.Context,
    customer: Annotated[str | None, typer.Option(help="only this customer's conversations")] = None,
    limit: Annotated[int, typer.Option(help="most recently active N")] = 30,
    fleet: FleetOption = None,
) -> None:
    """List conversations (newest activity first) with their turns, history kept and when they expire."""
    from roundtrip._cli.common import fleet_settings

    if ctx.invoked_subcommand is not None:
        use_fleet(fleet)
        return
    raise typer.Exit(asyncio.run(list_conversations(fleet_settings(fleet), customer, limit)))


@app.command("forget")
def conversations_forget(
    conversation_id: Annotated[str, typer.Argument(help="the conversation to erase")], fleet: FleetOption = None
) -> None:
    """Delete a conversation and its history now (a customer's right to erasure)."""
    from roundtrip._cli.common import fleet_settings

    raise typer.Exit(asyncio.run(forget_conversation(fleet_settings(fleet), conversation_id)))


async def list_conversations(settings: Settings, customer: str | None, limit: int) -> int:
    from rich.table import Table

    from roundtrip._cli.common import console, ledger_missing, plain
    from roundtrip._kernel.storage.ledger_reads import ConversationReads

    if ledger_missing(settings, settings.conversations_db_url):
        return 2
    store = await ConversationReads.open(settings.conversations_db_url, read_only=True)
    try:
        rows = await store.list(customer_id=customer, limit=limit)
    finally:
        await store.close()
    table = Table(box=None, pad_edge=False)
    for column in (
        "conversation",
        "customer",
        "turns",
        "in history",
        "dropped",
        "history tokens",
        "idle s",
        "expires in h",
    ):
        table.add_column(column)
    now = time.time()
    for r in rows:
        table.add_row(
            plain(r.conversation_id),
            plain(r.customer_id),
            str(r.turns),
            str(r.history_turns),
            str(r.dropped_turns),
            str(r.history_tokens),
            f"{now - r.updated_at:.0f}",
            f"{(r.updated_at + settings.conversation_retention_s - now) / 3600:.1f}",
        )
    console.print(table if rows else "no conversations")
    return 0


async def forget_conversation(settings: Settings, conversation_id: str) -> int:
    from roundtrip._cli.common import console, ledger_missing, plain
    from roundtrip._guard.conversations import Conversations

    if ledger_missing(settings, settings.conversations_db_url):
        return 2
    store = await Conversations.open(
        settings.conversations_db_url, settings.history_tokens, settings.conversation_retention_s
    )
    try:
        forgotten = await store.forget(conversation_id)
    finally:
        await store.close()
    if not forgotten:
        console.print(f"[red]no conversation {plain(conversation_id)}[/]")
        return 1
    console.print(
        f"conversation {plain(conversation_id)} forgotten: its history is deleted (a turn still running in it saves "
        "nothing)"
    )
    return 0
