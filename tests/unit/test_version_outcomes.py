"""Outcomes per agent version (issue 54): what each version's ended turns did, read from a real (SQLite) ledger in one
grouped read and a median by window functions (storage/versions.py; on PostgreSQL:
tests/integration/test_version_outcomes.py), as `roundtrip versions`, `roundtrip turns --version` and the console show
it; the metrics' `agent_version` label and the turn span's version; `roundtrip eval run --version`'s pinned
conversations, which the guard keeps on the version whatever the ramp says."""

from __future__ import annotations

import re
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from prometheus_client import REGISTRY

from roundtrip._cli import turns as turns_cli
from roundtrip._cli import versions as versions_cli
from roundtrip._cli.evals import runner
from roundtrip._cli.evals.cases import Case
from roundtrip._cli.evals.cases import Turn as CaseTurn
from roundtrip._cli.evals.verdict import Observed
from roundtrip._console import version_page
from roundtrip._console.web import application
from roundtrip._guard.conversations import Conversations
from roundtrip._guard.ledger import Ledger
from roundtrip._guard.replies import Replies
from roundtrip._guard.rules import Policy
from roundtrip._kernel.observability import metrics
from roundtrip._kernel.observability.telemetry import record_turn_span
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.storage.ledger_reads import TurnReads
from roundtrip._kernel.storage.turnstore import AWAITING, ENDED, RUNNING, approvals, turns
from roundtrip._kernel.storage.versions import VersionRow, Versions
from roundtrip._kernel.wire.events import CallModel, StartTurn, Turn, Usage
from tests.cores import guard as guard_of
from tests.databases import migrated
from tests.prices import price_table
from tests.unit.test_console_pages import console_for
from tests.unit.test_telemetry import TURN, traced  # noqa: F401 - a fixture

T0 = 1_700_000_000.0


def turn_row(turn_id: str, version: str | None, status: str, outcome: str | None, step: int, cost: float, took: float):
    return {
        "turn_id": turn_id,
        "request_id": f"req_{turn_id}",
        "conversation_id": f"conv_{turn_id}",
        "customer_id": "cus_1001",
        "status": status,
        "step": step,
        "started_at": T0,
        "last_progress_at": T0,
        "ended_at": T0 + took if status == ENDED else None,
        "outcome": outcome,
        "cost_usd": cost,
        "turn_json": "{}",
        "agent_version": version,
    }


# the default version's turns recorded with no version (before versions) and with "", v2's, and v3 drained, none
TURNS = [
    turn_row("turn_d1", None, ENDED, "end_turn", 2, 0.01, 4.0),
    turn_row("turn_d2", "", ENDED, "end_turn", 4, 0.03, 10.0),
    turn_row("turn_d3", "", ENDED, "deadline", 6, 0.02, 300.0),
    turn_row("turn_d4", None, RUNNING, None, 1, 0.0, 0.0),
    turn_row("turn_u1", "v2", ENDED, "end_turn", 2, 0.004, 2.0),
    turn_row("turn_u2", "v2", ENDED, "end_turn", 2, 0.006, 6.0),
    turn_row("turn_u3", "v2", AWAITING, None, 1, 0.0, 0.0),
    turn_row("turn_u4", "v2", ENDED, "budget", 3, 0.01, 3.0),
    turn_row("turn_u5", "v2", ENDED, "end_turn", 1, 0.0, 5.0),
]
# approval -> its turn: two of turn_d2, one of turn_u1, one of the running turn_u3, one of a turn retention deleted
ASKED = {"ap_1": "turn_d2", "ap_2": "turn_d2", "ap_3": "turn_u1", "ap_4": "turn_u3", "ap_5": "turn_gone"}
# share %, running, ended, outcomes, steps/turn, $/turn, approvals/turn, p50 s (3 ended: the middle; 4: the middle two)
EXPECTED = {
    "": ("90", "1", "3", "end_turn 2, deadline 1", "4.0", "0.0200", "0.67", "10.0"),
    "v2": ("10", "1", "4", "end_turn 3, budget 1", "2.0", "0.0050", "0.25", "4.0"),
    "v3": ("0", "0", "0", "", "-", "-", "-", "-"),
}
V2_IDS = ["turn_u1", "turn_u2", "turn_u3", "turn_u4", "turn_u5"]
DEFAULT_IDS = ["turn_d1", "turn_d2", "turn_d3", "turn_d4"]


def approval_row(approval_id: str, turn_id: str) -> dict:
    return dict(
        approval_id=approval_id, turn_id=turn_id, step=1, tool_use_id=f"toolu_{approval_id}", tool="cancel_order",
        input_sha256="0" * 64, customer_id="cus_1001", conversation_id=f"conv_{turn_id}", status="approved",
        reason="above 50.00 EUR", requested_at=T0, expires_at=T0 + 3600, request_json="{}",
    )  # fmt: skip


async def seeded(url: str) -> None:
    """TURNS and ASKED in the ledger at `url`; the ramp: v2 at 10 %, v3 ramped then drained."""
    store = await Versions.open(url)
    try:

        def work(conn) -> None:
            conn.execute(turns.insert(), TURNS)
            conn.execute(approvals.insert(), [approval_row(a, t) for a, t in ASKED.items()])

        await store._run(work, write=True)
        await store.ramp("v2", 10.0)
        await store.ramp("v3", 5.0)
        await store.drain("v3")
    finally:
        await store.close()


def figures(rows: list[VersionRow]) -> dict[str, tuple[str, ...]]:
    return {r.version: r.cells() for r in rows}


@pytest.fixture
async def url(tmp_path):
    url = await migrated(f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}")
    await seeded(url)
    return url


async def test_each_versions_ended_turns_are_summed_and_their_median_taken(url):
    store = await Versions.open(url, read_only=True)
    try:
        rows = await store.summary()
        running = [await store.running(v) for v in ("", "v2", "v3")]
    finally:
        await store.close()
    assert [(r.version, r.draining) for r in rows] == [("", False), ("v2", False), ("v3", True)]
    assert figures(rows) == EXPECTED
    v2 = rows[1]
    assert (v2.outcomes, v2.steps, v2.approvals, v2.p50_s) == ({"end_turn": 3, "budget": 1}, 8, 1, 4.0)
    assert running == [1, 1, 0]


async def test_the_read_port_filters_turns_by_version_and_reads_the_versions_as_the_cli_does(url):
    reads = await TurnReads.open(url, read_only=True)
    try:
        by = {v: sorted(r.turn_id for r in await reads.list(version=v)) for v in ("v2", "", "v3")}
        every = await reads.list()
        versions = await reads.versions()
    finally:
        await reads.close()
    assert by == {"v2": V2_IDS, "": DEFAULT_IDS, "v3": []}
    assert len(every) == len(TURNS)
    assert {r.turn_id: r.shown_version for r in every if r.turn_id in ("turn_d1", "turn_d2", "turn_u1")} == {
        "turn_d1": "(default)",
        "turn_d2": "(default)",
        "turn_u1": "v2",
    }
    assert figures(versions) == EXPECTED


def test_a_versions_figures_are_means_per_ended_turn_and_none_before_one_ended():
    row = VersionRow("v2", 12.5, outcomes={"budget": 1, "end_turn": 3, "cycle": 1}, steps=11, cost_usd=0.05)
    row.approvals, row.p50_s = 2, 3.26
    assert row.mix == "end_turn 3, budget 1, cycle 1"  # the most frequent first, then by name
    assert row.cells() == ("12.5", "0", "5", "end_turn 3, budget 1, cycle 1", "2.2", "0.0100", "0.40", "3.3")
    assert VersionRow("v4", 0.0).cells() == ("0", "0", "0", "", "-", "-", "-", "-")


def plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)  # colours, where the terminal is forced


async def test_roundtrip_versions_and_turns_version_show_each_versions_figures_and_turns(url, tmp_path, capsys):
    settings = Settings(_env_file=None, state_dir=tmp_path, ledger_database_url=url)
    assert await versions_cli.show(settings) == 0
    lines = {line.split()[0]: line.split() for line in plain(capsys.readouterr().out).splitlines() if line.strip()}
    assert lines["version"][:5] == ["version", "share", "%", "running", "ended"]
    default = ["(default)", "90", "1", "3", "end_turn", "2,", "deadline", "1", "4.0", "0.0200", "0.67", "10.0"]
    assert lines["(default)"] == default
    assert lines["v2"] == ["v2", "10", "1", "4", "end_turn", "3,", "budget", "1", "2.0", "0.0050", "0.25", "4.0"]
    assert lines["v3"] == ["v3", "(draining)", "0", "0", "0", "-", "-", "-", "-"]

    for word, ids, other in (("v2", V2_IDS, DEFAULT_IDS), ("default", DEFAULT_IDS, V2_IDS)):
        assert await turns_cli.list_turns(settings, None, None, 30, None, word) == 0
        listed = [line.split() for line in plain(capsys.readouterr().out).splitlines()]
        rows = {cells[0]: cells for cells in listed if cells and cells[0].startswith("turn_")}
        assert sorted(rows) == ids and not set(rows) & set(other)
        assert {cells[3] for cells in rows.values()} == {"v2" if word == "v2" else "(default)"}  # the version column


async def test_the_console_compares_the_versions_and_lists_one_versions_turns(url):
    console, _, _ = console_for(url)
    app = application(console, version_page.routes(console))
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver")
    try:
        page = await http.get("/versions")
        v2_turns = (await http.get("/turns/live", params={"version": "v2"})).text
        default_turns = (await http.get("/turns/live", params={"version": "default"})).text
        form = (await http.get("/turns", params={"version": "v2"})).text
    finally:
        await http.aclose()
        await console.books.close()
    assert page.status_code == 200 and '<a href="/versions">Versions</a>' in page.text
    rows = dict(re.findall(r'<tr data-agent-version="([^"]*)">(.*?)</tr>', page.text))
    assert set(rows) == {"", "v2", "v3"}
    for version, cells in EXPECTED.items():
        assert re.findall(r"<td>([^<]*)</td>", rows[version]) == list(cells), rows[version]
    assert '<a href="/turns?version=v2">v2</a>' in rows["v2"]
    assert '<a href="/turns?version=default">(default)</a>' in rows[""] and "(draining)" in rows["v3"]
    assert sorted(re.findall(r'<tr data-turn="([^"]+)">', v2_turns)) == V2_IDS
    assert '<td class="version">v2</td>' in v2_turns and '<td class="version">(default)</td>' not in v2_turns
    assert sorted(re.findall(r'<tr data-turn="([^"]+)">', default_turns)) == DEFAULT_IDS
    assert 'name="version" placeholder="agent version (v2, default)" value="v2"' in form


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_the_turn_metrics_name_the_version_and_keep_its_label_values_few(monkeypatch):
    monkeypatch.setattr(metrics, "_versions_labelled", set())
    ended = sample("roundtrip_turns_total", outcome="budget", agent_version="v2")
    reply = {"outcome": "budget", "agent_version": "v2", "lane": "interactive"}
    replied = sample("roundtrip_reply_seconds_count", **reply)
    metrics.count_turn_end("budget", 3, "v2")
    turn = SimpleNamespace(started_at=1000.0, trace_id="", agent_version="v2", lane="interactive")
    metrics.count_reply(turn, "budget", 1002.0)
    assert sample("roundtrip_turns_total", outcome="budget", agent_version="v2") == ended + 1
    assert sample("roundtrip_reply_seconds_count", **reply) == replied + 1
    assert metrics.version_label("") == "default"
    assert metrics.version_label("v2.1") == "(other)"  # no version's name: whatever a message carried
    for n in range(metrics.MAX_VERSION_LABELS - 1):
        assert metrics.version_label(f"v{n + 3}") == f"v{n + 3}"
    assert metrics.version_label("one-too-many") == "(other)"
    assert metrics.version_label("v2") == "v2" and metrics.version_label("") == "default"  # those counted stay


def test_the_turn_span_names_every_turns_version_the_default_one_too(traced):  # noqa: F811
    _tracer, exporter = traced
    for turn, digest in ((TURN, "0123456789abcdef"), (TURN.model_copy(update={"agent_version": "v2"}), "")):
        record_turn_span(
            turn,
            outcome="end_turn",
            steps=1,
            usage=Usage(),
            cost_usd=0.0,
            agent_name="support-agent",
            agent_digest="0123456789abcdef",
            model="",
            provider="anthropic",
        )
        (span,) = exporter.get_finished_spans()
        exporter.clear()
        assert span.attributes["roundtrip.agent.version"] == (turn.agent_version or "default")
        assert span.attributes.get("roundtrip.agent.digest", "") == digest  # the gateway runs the default one's agent


async def test_an_eval_on_a_version_pins_its_conversations_there_and_the_guard_keeps_them(tmp_path):
    url = await migrated(f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}")
    settings = Settings(_env_file=None, state_dir=tmp_path, ledger_database_url=url)
    with pytest.raises(runner.FleetUnavailable, match="agent version v2 is not in this fleet's ramp"):
        await runner.pinning(settings, "v2")
    with pytest.raises(runner.FleetUnavailable, match="is not a version name"):
        await runner.pinning(settings, "v.2")
    ledger, sent = await Ledger.open(url), []

    async def publish(topic, message, conversation_id):
        if isinstance(message, CallModel):
            sent.append(message)

    conversations = await Conversations.open(url)
    guard = guard_of(
        ledger=ledger,
        policy=Policy(replies=Replies()),
        prices=price_table(),
        publish=publish,
        conversations=conversations,
    )
    try:
        await ledger.ramp("v2", 0.0)  # in service, but no new conversation goes there
        pinned = await runner.pinning(settings, "v2")
        try:
            await pinned.claim("conv_eval_1", "cus_1001", "v2", time.time())  # as Asker.pin does before the first turn
        finally:
            await pinned.close()
        for n, conversation in enumerate(("conv_eval_1", "conv_other")):
            turn = Turn(
                turn_id=f"turn_{n}", request_id=f"req_{n}", conversation_id=conversation, customer_id="cus_1001"
            )
            assert await guard.starts.on_start(StartTurn(turn=turn, text="hi")) == "started"
        assert [call.turn.agent_version for call in sent] == ["v2", ""]  # the ramp gave the other one the default
        assert (await ledger.get("turn_0")).agent_version == "v2"
        await ledger.drain("v2")
        with pytest.raises(runner.FleetUnavailable, match="agent version v2 drains"):
            await runner.pinning(settings, "v2")
    finally:
        await guard.outbox.drain()
        await ledger.close()
        await conversations.close()


async def test_an_eval_turn_that_ran_on_another_version_fails_its_case():
    pinned: list[str] = []

    class Asker:
        token, version, settings = "tok", "v2", SimpleNamespace(use_simulator=False)

        async def pin(self, conversation: str, customer: str) -> None:
            pinned.append(conversation)

        async def turn(self, customer, conversation, turn, persona, timeout) -> Observed:
            return Observed("req_1", versions={"", "v2"})  # one model call on the default version: no reply came

    case = Case("hello", Path("hello.json"), "cus_1001", (CaseTurn("hi"),))
    result = await runner.run_case(Asker(), case, 0, 5.0)
    assert pinned == [result.conversation]
    assert result.failures == ["no reply within 5 s", "ran on agent version (default), not v2"]
