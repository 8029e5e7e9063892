"""`roundtrip approvals`: the calls waiting for a person listed, and `approve`/`deny`: a person's decision signed and
published with the console's own checks (services/_console/decisions.py)."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Annotated

import typer

from roundtrip._cli.fleets import FleetOption, use_fleet
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire import topics

if TYPE_CHECKING:
    from roundtrip._kernel.storage.ledger_reads import ApprovalRow


app = typer.Typer(
    help="Calls waiting for a person's approval: list them, approve or deny one.", invoke_without_command=True
)


@app.callback()
def approvals(
    ctx: typer.Context,
    all_: Annotated[
        bool, typer.Option("--all", help="every approval, decided ones too (who decided and when)")
    ] = False,
    limit: Annotated[int, typer.Option(help="most recent N")] = 30,
    fleet: FleetOption = None,
) -> None:
    """List the calls waiting for a person's approval (who, what, why, deadline, trace id)."""
    from roundtrip._cli.common import fleet_settings

    if ctx.invoked_subcommand is not None:
        use_fleet(fleet)
        return
    raise typer.Exit(asyncio.run(list_approvals(fleet_settings(fleet), all_, limit)))


@app.command("approve")
def approvals_approve(
    approval_id: Annotated[str, typer.Argument(help="the approval (roundtrip approvals lists them)")],
    by: Annotated[str | None, typer.Option(help="who decides (default: user@host)")] = None,
    reason: Annotated[str, typer.Option(help="kept with the turn")] = "",
    fleet: FleetOption = None,
) -> None:
    """Approve one waiting call: it runs once, with exactly the arguments shown, and the turn goes on."""
    from roundtrip._cli.common import fleet_settings, me

    raise typer.Exit(asyncio.run(decide(fleet_settings(fleet), approval_id, True, reason, by or me())))


@app.command("deny")
def approvals_deny(
    approval_id: Annotated[str, typer.Argument(help="the approval (roundtrip approvals lists them)")],
    reason: Annotated[str, typer.Option(help="why: the model is told and explains it to the customer")],
    by: Annotated[str | None, typer.Option(help="who decides (default: user@host)")] = None,
    fleet: FleetOption = None,
) -> None:
    """Deny one waiting call: it never runs; the model gets an error result with the reason and goes on."""
    from roundtrip._cli.common import fleet_settings, me

    raise typer.Exit(asyncio.run(decide(fleet_settings(fleet), approval_id, False, reason, by or me())))


APPROVAL_COLUMNS = (
    "approval",
    "status",
    "customer",
    "call",
    "why",
    "waiting s",
    "deadline in s",
    "decided by",
    "turn",
    "trace id",
)


REASON_WIDTH = 24  # the "why" column wraps, at least this wide (or its longest reason)


async def list_approvals(settings: Settings, everything: bool, limit: int) -> int:
    """Calls waiting for a person (or, with everything, every approval with who decided and when)."""
    from rich.measure import Measurement
    from rich.table import Table
    from rich.text import Text

    from roundtrip._cli.common import call_label, console, ledger_missing, print_wide, short
    from roundtrip._kernel.storage.ledger_reads import PENDING, TurnReads
    from roundtrip._kernel.wire.events import ApprovalRequested

    if ledger_missing(settings):
        return 2
    ledger = await TurnReads.open(settings.ledger_db_url, read_only=True)
    try:
        rows = await ledger.list_approvals(status=None if everything else PENDING, limit=limit)
    finally:
        await ledger.close()
    now = time.time()
    cells = []
    for r in rows:
        request = ApprovalRequested.model_validate_json(r.request_json)
        decided = (
            f"{r.decided_by} at {time.strftime('%H:%M:%S', time.localtime(r.decided_at))}"
            if r.decided_by and r.decided_at
            else ""
        )
        cells.append(
            (
                r.approval_id,
                r.status,
                r.customer_id,
                call_label(r.tool, request.call.input),
                short(r.reason, 90),
                f"{(r.decided_at or now) - r.requested_at:.0f}",
                f"{r.expires_at - now:.0f}" if r.status == PENDING else "",
                decided,
                r.turn_id,
                request.turn.trace_id,
            )
        )
    if not rows:
        console.print("no approvals" if everything else "no calls are waiting for approval")
        return 0
    table = Table(box=None, pad_edge=False)
    for i, column in enumerate(APPROVAL_COLUMNS):
        longest = max(len(column), *(len(c[i]) for c in cells))
        whole = column != "why"  # only the reason wraps: the ids and the call are never cut (people copy them)
        table.add_column(column, no_wrap=whole, min_width=longest if whole else min(longest, REASON_WIDTH))
    for row in cells:
        table.add_row(*(Text(cell) for cell in row))  # as text: a label or a reason is never read as markup
    print_wide(table, Measurement.get(console, console.options.update(width=10_000), table).minimum)
    return 0


async def decide(settings: Settings, approval_id: str, approve: bool, reason: str, decided_by: str) -> int:
    """Sign a decision and publish it to turn.approval_decisions: the same checks and message as the console's."""
    from typing import cast

    from roundtrip._cli.common import call_label, console, ledger_missing, plain
    from roundtrip._console.decisions import decision_signer, refusal, signed_decision
    from roundtrip._kernel.kafka.clients import kafka_clients
    from roundtrip._kernel.settings import ConfigurationError
    from roundtrip._kernel.storage.ledger_reads import TurnReads
    from roundtrip._kernel.wire.events import ApprovalRequested

    try:  # the key first: a placeholder, a malformed or (outside development) the published key signs nothing
        settings.refuse_unfit_keys("roundtrip approvals", ("decision_signing_key",))
    except ConfigurationError as exc:
        console.print(f"[red]{plain(str(exc))}[/]")
        return 2
    if ledger_missing(settings):
        return 2
    ledger = await TurnReads.open(settings.ledger_db_url, read_only=True)
    try:
        row = await ledger.approval(approval_id)
        turn = await ledger.get(row.turn_id) if row else None
    finally:
        await ledger.close()
    refused = refusal(approval_id, row, turn)
    if refused is not None:
        hint = " (see `roundtrip approvals`)" if refused.status == 404 else ""
        console.print(f"[red]{plain(refused.message)}[/]{hint}")
        return 1
    row = cast("ApprovalRow", row)  # no refusal: the approval exists
    decision = signed_decision(row, approve, reason, decided_by, decision_signer(settings))
    producer = kafka_clients(settings).producer()
    try:
        await producer.start()
        await producer.send_and_wait(
            topics.t(topics.APPROVAL_DECISIONS, settings.topic_prefix),
            decision.model_dump_json().encode(),
            key=row.conversation_id.encode(),
        )
    finally:
        await producer.stop()
    request = ApprovalRequested.model_validate_json(row.request_json)
    console.print(
        f"{'approved' if approve else 'denied'} {plain(call_label(row.tool, request.call.input))} for "
        f"{plain(row.customer_id)} "
        f"(approval {plain(approval_id)}, turn {row.turn_id}) as {plain(decided_by)}; the guard resumes the turn"
    )
    return 0
