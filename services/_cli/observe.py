"""`roundtrip trace`, `dead-letters` and `lag`: a turn's spans as a timeline, the messages no service could process,
and each consumer group's lag, over the same topics and span files the fleet writes."""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Annotated, Any

import typer

from roundtrip._cli.fleets import FleetOption
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire import topology

if TYPE_CHECKING:
    from roundtrip._kernel.kafka.admin import GroupLag
    from roundtrip._kernel.kafka.dead_letters import Letter
    from roundtrip._kernel.wire.letters import DeadLettered, DeadLetterHandled


def trace(
    turn_or_trace_id: Annotated[str, typer.Argument(help="turn id or trace id")], fleet: FleetOption = None
) -> None:
    """Show the spans of one turn as an indented timeline: from Jaeger (ROUNDTRIP_JAEGER_QUERY_URL) or span files."""
    from roundtrip._cli.common import fleet_settings

    raise typer.Exit(show_trace(fleet_settings(fleet), turn_or_trace_id))


def dead_letters(
    limit: Annotated[int, typer.Option(min=1, help="the last N dead letters")] = 20,
    fleet: FleetOption = None,
) -> None:
    """Show the messages no service could process, newest last, with the reason and whether each was handled.

    Each is marked waiting, re-driven or discarded (by whom, when, why) as the console's /dead-letters page recorded it.
    Exit code 2: the dead letters cannot be read."""
    from roundtrip._cli.common import fleet_settings

    raise typer.Exit(asyncio.run(show_dead_letters(fleet_settings(fleet), limit)))


def lag(
    group: Annotated[
        str | None, typer.Option(help="only this consumer group (e.g. executor, or its full name)")
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="one JSON document (per refresh with --watch)")] = False,
    watch: Annotated[float | None, typer.Option(help="refresh every SECONDS until Ctrl-C")] = None,
    fleet: FleetOption = None,
) -> None:
    """Each consumer group's lag per topic and partition (committed, log end, lag), totals and members."""
    from roundtrip._cli.common import fleet_settings

    if watch is not None and watch <= 0:
        raise typer.BadParameter("--watch takes a number of seconds > 0")
    settings = fleet_settings(fleet)
    if group is not None and topology.find_group(group, settings.topic_prefix) is None:
        known = ", ".join(sorted(topology.groups(settings.topic_prefix)))
        raise typer.BadParameter(
            f"unknown consumer group {group!r}; the fleet's groups are: {known} "
            "(also without the topic prefix and roundtrip-)",
            param_hint="'--group'",
        )
    try:
        raise typer.Exit(asyncio.run(show_lag(settings, group, json_output, watch)))
    except KeyboardInterrupt:
        raise typer.Exit(0) from None


def show_trace(settings: Settings, wanted: str) -> int:
    """The spans of one turn (turn id or trace id): from Jaeger's query API if configured, else the span files."""
    from rich.markup import escape

    from roundtrip._cli.common import console
    from roundtrip._kernel.observability import traces

    try:
        trace_id, mine = traces.read(settings, wanted)
    except traces.TraceUnreadable as exc:
        if settings.effective_jaeger_query_url:
            console.print(f"[red]{escape(str(exc))}[/]; is it up? (ROUNDTRIP_JAEGER_QUERY_URL)")
            return 2
        console.print(
            f"[red]{escape(str(exc))}[/]; with ROUNDTRIP_OTLP_ENDPOINT set, set ROUNDTRIP_JAEGER_QUERY_URL "
            "to read the trace from Jaeger"
        )
        return 1
    if not mine:
        where = settings.effective_jaeger_query_url or settings.effective_span_file
        console.print(f"[red]no spans[/] for {escape(wanted)} in {where}")
        return 1
    _print_trace(trace_id, mine)
    return 0


def _print_trace(trace_id: str, spans: list[dict[str, Any]]) -> None:
    from rich.table import Table

    from roundtrip._cli.common import console, plain, short

    mine = sorted(spans, key=lambda s: s["start_ns"])
    children: dict[str | None, list[dict[str, Any]]] = defaultdict(list)
    ids = {s["span_id"] for s in mine}
    for s in mine:
        children[s["parent_id"] if s["parent_id"] in ids else None].append(s)
    t0 = mine[0]["start_ns"]
    table = Table(title=f"trace {trace_id}", box=None, pad_edge=False)
    for column, justify in (("start ms", "right"), ("took ms", "right"), ("service", "left"), ("span", "left")):
        table.add_column(column, justify="right" if justify == "right" else "left")

    def add(span: dict[str, Any], depth: int) -> None:
        took = (span["end_ns"] - span["start_ns"]) / 1e6
        name = ("  " * min(depth, 12)) + plain(span["name"])
        if span["status"] == "ERROR":
            name += " [red]ERROR[/]" + (
                f" [red]{plain(short(span['status_message'], 80))}[/]" if span.get("status_message") else ""
            )
        attrs = span["attributes"]
        extra = " ".join(
            f"{k.split('.')[-1]}={plain(attrs[k])}"
            for k in (
                "roundtrip.step",
                "roundtrip.decision",
                "roundtrip.outcome",
                "roundtrip.approved",
                "roundtrip.detail",
            )
            if attrs.get(k) not in (None, "")
        )
        table.add_row(
            f"{(span['start_ns'] - t0) / 1e6:.1f}",
            f"{took:.1f}",
            plain(str(span["service"]).removeprefix("roundtrip-")),
            f"{name} [dim]{extra}[/]",
        )
        for child in children.get(span["span_id"], []):
            add(child, depth + 1)

    for root in children[None]:
        add(root, 0)
    console.print(table)


async def show_dead_letters(settings: Settings, limit: int) -> int:
    """The last `limit` dead letters, newest last, each marked waiting or as the console handled it."""
    from roundtrip._cli.common import console, plain
    from roundtrip._kernel.kafka.dead_letters import DeadLetterReader, LettersAway

    reader = DeadLetterReader(settings, limit, "roundtrip-dead-letters", timeout_s=60.0)
    try:
        await reader.read()
    except LettersAway as exc:
        console.print(f"[red]error:[/] {plain(exc)}")
        return 2
    finally:
        await reader.close()
    tail = reader.tail()
    if not tail:
        console.print("no dead letters")
        return 0
    for item, handling in tail:
        _print_letter(item, handling)
    waiting = sum(1 for _, handling in tail if handling is None)
    console.print(
        f"{len(tail)} shown: {waiting} waiting, {len(tail) - waiting} handled "
        "(re-drive or discard one on the console's /dead-letters page)"
    )
    return 0


def _print_letter(item: Letter, handling: DeadLetterHandled | None) -> None:
    from roundtrip._cli.common import console, plain, short
    from roundtrip._kernel.kafka.dead_letters import PAST

    def stamp(at: float) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))

    done = plain(PAST.get(handling.action, handling.action)) if handling else ""
    letter = item.letter
    what = (
        f"{plain(letter.service)} could not process {plain(letter.topic)} (partition {letter.partition}, offset "
        f"{letter.offset}, key {plain(letter.key)})"
        if letter
        else "a record"
    )
    state = f"[green]{done}[/]" if handling else "[yellow]waiting[/]"
    console.print(f"[bold]{stamp(item.at)}[/] {plain(item.id)} {state} {what}: [red]{plain(item.reason)}[/]")
    if handling is not None:
        to = f" to {plain(handling.topic)}" if handling.topic else ""
        note = f": {plain(handling.note)}" if handling.note else ""
        console.print(f"  {done} by {plain(handling.by)} at {stamp(handling.at)}{to}{note}")
    console.print(f"  {plain(short(_as_bytes_say(letter) if letter else item.raw, 300))}")


def _as_bytes_say(letter: DeadLettered) -> str:
    """The record as its lossless copy says (what a re-drive would publish), else the readable copy."""
    from roundtrip._kernel.kafka.dead_letters import copy_of

    try:
        value = copy_of(letter).value if letter.payload_base64 else None
    except ValueError:
        value = None
    return letter.payload if value is None else value[:2000].decode("utf-8", "replace")


async def show_lag(settings: Settings, group: str | None, as_json: bool, watch: float | None) -> int:
    """Each consumer group's lag per topic and partition, its total, and its members; refreshed every `watch` s."""
    import asyncio

    from roundtrip._cli.common import console
    from roundtrip._kernel.kafka.admin import consumer_lag
    from roundtrip._kernel.kafka.clients import kafka_clients

    while True:
        report = await consumer_lag(kafka_clients(settings), settings.topic_prefix, group)
        if as_json:
            print(
                json.dumps(
                    {
                        "at": round(time.time(), 3),
                        "bootstrap": settings.bootstrap_servers,
                        "groups": [g.as_dict() for g in report],
                    }
                ),
                flush=True,
            )
        else:
            if watch:
                console.clear()
            _render_lag(report, settings)
        if not watch:
            return 0
        await asyncio.sleep(watch)


def _render_lag(report: list[GroupLag], settings: Settings) -> None:
    from rich.table import Table

    from roundtrip._cli.common import console, plain

    table = Table(
        box=None, pad_edge=False, title=f"consumer lag at {time.strftime('%H:%M:%S')} ({settings.bootstrap_servers})"
    )
    for column, justify in (
        ("group", "left"),
        ("state", "left"),
        ("topic", "left"),
        ("partition", "right"),
        ("committed", "right"),
        ("end", "right"),
        ("lag", "right"),
    ):
        table.add_column(column, justify="right" if justify == "right" else "left")
    for g in report:
        state = g.state if g.state == "Stable" else f"[yellow]{g.state}[/]"
        for i, p in enumerate(g.partitions):
            committed = "-" if p.committed is None else str(p.committed)
            lag = f"[red]{p.lag}[/]" if p.lag else "0"
            table.add_row(
                plain(g.group) if i == 0 else "",
                state if i == 0 else "",
                plain(p.topic),
                str(p.partition),
                committed,
                str(p.end),
                lag,
            )
        total = f"[bold red]{g.lag}[/]" if g.lag else "[bold]0[/]"
        table.add_row(
            "" if g.partitions else plain(g.group),
            "" if g.partitions else state,
            "[bold]total[/]",
            "",
            "",
            "",
            total,
            end_section=True,
        )
    console.print(table)
    members = Table(box=None, pad_edge=False, title="members")
    for column in ("group", "client id", "host", "assigned partitions"):
        members.add_column(column)
    for g in report:
        for m in g.members:
            assigned = ", ".join(f"{t}[{n}]" for t, n in m.partitions) or "-"
            members.add_row(plain(g.group), plain(m.client_id), plain(m.host), plain(assigned))
        if not g.members:
            members.add_row(plain(g.group), "[yellow](no members)[/]", "", "")
    console.print(members)
