"""Agent versions side by side (issue 54), end to end: the demo shop agent as the default version and its version 2
(another system prompt, its help center search renamed: tests/shop_v2_agent.py), each with a model, gate and executor
of its own, the guard, gateway and ledger shared. `roundtrip versions ramp v2 20%` sends a fifth of new conversations
to v2: every model call of every turn carried the prompt and tools of its turn's version (the simulator records what
it was sent), the shares are within bounds, a conversation's later turn stays on its first turn's version after the
ramp moved on, every turn got one reply, another customer cannot enter a v2 conversation, and `roundtrip versions`
shows both versions' turns; drained, v2 gets no turn: its conversations move on.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import uuid

import httpx
import pytest

from roundtrip._broker.embedded import free_port
from roundtrip._fleet.launcher import Fleet
from roundtrip._guard.versions import assign
from roundtrip._kernel.storage.ledger_reads import TurnReads
from roundtrip._kernel.wire.events import Outcome
from roundtrip._shop.agent import AGENT as V1
from tests.agents import ShopFleetSettings
from tests.e2e.conftest import FleetClient, fleet_env
from tests.shop_v2_agent import AGENT as V2
from tests.signing import key_settings

CUSTOMER, OTHER = "cus_1001", "cus_1002"
CONVERSATIONS = [f"conv_{i}" for i in range(60)]  # fixed ids: their buckets, so the shares they get, are fixed too
CALLS_A_TURN = 2  # the `direct` persona's lookup, then its answer


@pytest.fixture(scope="module")
def versioned_fleet(kafka_bootstrap, tmp_path_factory):
    state = tmp_path_factory.mktemp("versions-fleet")
    values = dict(
        kafka_bootstrap_servers=kafka_bootstrap,
        kafka_allow_plaintext=True,  # the test broker listens in the clear; the fleet is not development
        topic_prefix=f"ver{uuid.uuid4().hex[:6]}.",
        state_dir=state,
        simulator_port=free_port(),
        console_port=free_port(),
        shop_port=free_port(),
        partitions=2,
        log_level="INFO",
        **key_settings("ver1"),  # fresh pairs, never the published development keys
    )
    versions = {"v2": {"ROUNDTRIP_AGENT": "tests.shop_v2_agent:AGENT"}}
    with Fleet(ShopFleetSettings(**values), env=fleet_env(**values), versions=versions) as fleet:
        yield fleet


@pytest.fixture(scope="module")
async def client(versioned_fleet):
    c = FleetClient(versioned_fleet.settings)
    await c.start()
    yield c
    await c.stop()


def roundtrip(fleet: Fleet, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **fleet.env, "ROUNDTRIP_STATE_DIR": str(fleet.settings.state_dir)}
    return subprocess.run(
        [sys.executable, "-m", "roundtrip._cli.main", *args], env=env, capture_output=True, text=True, timeout=120
    )


def text_of(content) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(b.get("text", "") for b in content if b.get("type") == "text")


def version_sent(body: dict) -> str:
    """Which version's agent made this call, by its system prompt and tools; "mixed" when they disagree."""
    system, tools = text_of(body["system"]), {t["name"] for t in body["tools"]}
    if system == V2.system_prompt and "search_faq" in tools and "search_help_center" not in tools:
        return "v2"
    if system == V1.system_prompt and "search_help_center" in tools and "search_faq" not in tools:
        return ""
    return "mixed"


async def ask_all(client: FleetClient, conversations: list[str]) -> dict[str, str]:
    """One turn in each conversation, all at once: conversation -> its reply's turn id, once every reply is in."""
    asked = {
        conversation: await client.ask(
            f'lookup_order {{"order_id": "ord_{conversation}"}}', CUSTOMER, "direct", conversation_id=conversation
        )
        for conversation in conversations
    }
    replies = await asyncio.gather(*(client.reply(r, timeout=180) for r in asked.values()))
    return {conversation: reply.turn_id for conversation, reply in zip(asked, replies, strict=True)}


async def versions_of(fleet: Fleet, turn_ids: dict[str, str]) -> dict[str, str]:
    """conversation -> the version the ledger recorded for its turn."""
    ledger = await TurnReads.open(fleet.settings.ledger_db_url, read_only=True)
    try:
        rows = {c: await ledger.get(t) for c, t in turn_ids.items()}
    finally:
        await ledger.close()
    return {c: row.agent_version or "" for c, row in rows.items() if row is not None}


def received(fleet: Fleet) -> list[dict]:
    port = fleet.settings.simulator_port
    return httpx.get(f"http://127.0.0.1:{port}/v1/_received", params={"persona": "direct"}, timeout=10).json()[
        "requests"
    ]


def by_conversation(requests: list[dict]) -> dict[str, list[str]]:
    """conversation -> the version each model call of it was made by (the first user message names it)."""
    found: dict[str, list[str]] = {}
    for request in requests:
        first = text_of(request["body"]["messages"][0]["content"])
        conversation = first.split('"ord_', 1)[1].split('"', 1)[0]
        found.setdefault(conversation, []).append(version_sent(request["body"]))
    return found


async def test_two_versions_side_by_side_each_turn_on_its_own_version_the_ramp_sticky(versioned_fleet, client):
    fleet = versioned_fleet
    ramped = roundtrip(fleet, "versions", "ramp", "v2", "20%")
    assert ramped.returncode == 0, ramped.stderr + ramped.stdout
    assert "v2 20 %" in ramped.stdout and "the default version 80 %" in ramped.stdout, ramped.stdout

    first = await ask_all(client, CONVERSATIONS)
    versions = await versions_of(fleet, first)
    assert len(versions) == len(CONVERSATIONS)
    on_v2 = sorted(c for c, v in versions.items() if v == "v2")
    assert set(versions.values()) <= {"", "v2"}
    assert 6 <= len(on_v2) <= 18, f"{len(on_v2)} of {len(CONVERSATIONS)} conversations on v2 at a 20 % ramp"
    calls = by_conversation(received(fleet))
    for conversation, version in versions.items():
        assert calls.get(conversation) == [version] * CALLS_A_TURN, (conversation, version, calls.get(conversation))

    # the ramp moves on: v2's conversations stay on v2; a new one the 20 % ramp would have sent there does not go
    assert roundtrip(fleet, "versions", "ramp", "v2", "0").returncode == 0
    fresh = [c for c in (f"conv_new_{i}" for i in range(500)) if assign(c, {"v2": 20.0}) == "v2"][:3]
    await asyncio.sleep(1.5)  # the guard reads the ramp again within a second (services/_guard/versions.py)
    second = await ask_all(client, on_v2[:5] + fresh)
    assert await versions_of(fleet, second) == {**dict.fromkeys(on_v2[:5], "v2"), **dict.fromkeys(fresh, "")}
    calls = by_conversation(received(fleet))
    for conversation in on_v2[:5]:  # both its turns
        assert calls[conversation] == ["v2"] * CALLS_A_TURN * 2, calls[conversation]
    for conversation in fresh:
        assert calls[conversation] == [""] * CALLS_A_TURN, calls[conversation]

    # the one-customer check holds for a v2 conversation as for any
    refused = await client.reply(
        await client.ask("show my orders", OTHER, "direct", conversation_id=on_v2[0]), timeout=60
    )
    assert refused.outcome is Outcome.CONVERSATION_REFUSED

    # v2 drained: nothing of it runs, and its conversations' next turns move to the version the ramp gives
    drained = roundtrip(fleet, "versions", "drain", "v2")
    assert drained.returncode == 0 and "v2 runs no turn and gets none" in drained.stdout, drained.stdout
    await asyncio.sleep(1.5)  # the guard reads the ramp again within a second (services/_guard/versions.py)
    moved = await ask_all(client, on_v2[5:6])
    assert await versions_of(fleet, moved) == {on_v2[5]: ""}
    assert by_conversation(received(fleet))[on_v2[5]] == ["v2"] * CALLS_A_TURN + [""] * CALLS_A_TURN

    await client.settled(timeout=120)
    assert all(len(replies) == 1 for replies in client.replies.values()), "a request answered twice"
    answered = {r.turn_id: r.outcome for replies in client.replies.values() for r in replies}
    assert {answered[t] for t in (*first.values(), *second.values(), *moved.values())} == {Outcome.END_TURN}

    shown = roundtrip(fleet, "versions")
    assert shown.returncode == 0, shown.stderr
    lines = {line.split()[0]: line for line in shown.stdout.splitlines() if line.strip()}
    assert "v2" in lines and "(default)" in lines, shown.stdout
    assert f" {len(on_v2) + 5} " in lines["v2"], lines["v2"]  # its turns ended, by outcome


# -- outcomes per version: roundtrip versions, turns --version, an eval on v2 (issue 54 item 4) ----------------------


async def test_versions_and_turns_show_each_versions_outcomes_and_an_eval_runs_on_v2_at_no_share(
    versioned_fleet, tmp_path
):
    """On the module's fleet after the test above (its turns are there): `roundtrip eval run --version v2` at a 0 %
    ramp runs its cases on v2, and `roundtrip versions` / `roundtrip turns --version` show what the ledger holds."""
    fleet = versioned_fleet
    assert roundtrip(fleet, "versions", "ramp", "v2", "0").returncode == 0  # in service, no new conversation
    await asyncio.sleep(1.5)  # the guard reads the ramp again within a second (services/_guard/versions.py)
    (tmp_path / "cases").mkdir()
    case = {"customer": CUSTOMER, "message": "hello", "script": ["Hello from v2."], "runs": 2}
    (tmp_path / "cases" / "hello.json").write_text(json.dumps({**case, "expect": {"outcome": ["end_turn"]}}))
    ran = await asyncio.to_thread(roundtrip, fleet, "eval", "run", "--version", "v2", str(tmp_path / "cases"))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "1 cases against agent version v2 of the fleet" in ran.stdout, ran.stdout

    ledger = await TurnReads.open(fleet.settings.ledger_db_url, read_only=True)
    try:
        on_v2 = await ledger.list(version="v2", limit=1000)
        on_default = await ledger.list(version="", limit=1000)
    finally:
        await ledger.close()
    evals = [r for r in on_v2 if r.conversation_id.startswith("conv_eval_")]
    assert len(evals) == 2 and {r.outcome for r in evals} == {"end_turn"}  # on v2 though the ramp gives it none

    listed = roundtrip(fleet, "turns", "--version", "v2", "--limit", "1000")
    ids = {r.turn_id for r in on_v2 + on_default}
    rows = [cells for cells in map(str.split, listed.stdout.splitlines()) if cells and cells[0] in ids]
    assert {cells[0] for cells in rows} == {r.turn_id for r in on_v2}, listed.stdout
    assert {cells[3] for cells in rows} == {"v2"}  # the version column

    shown = roundtrip(fleet, "versions")
    assert shown.returncode == 0, shown.stderr
    lines = {cells[0]: cells for cells in map(str.split, shown.stdout.splitlines()) if cells}
    assert lines["v2"][1] == "0", shown.stdout  # its share
    for name, turns in (("v2", on_v2), ("(default)", on_default)):
        ended = [r for r in turns if r.status == "ended"]
        cells = lines[name]
        assert cells[3] == str(len(ended)), cells  # after its share and running turns
        assert cells[-4] == f"{sum(r.step for r in ended) / len(ended):.1f}", cells  # steps per ended turn
        assert float(cells[-3]) == pytest.approx(sum(r.cost_usd for r in ended) / len(ended), abs=5.1e-5), cells
        assert re.fullmatch(r"\d+\.\d", cells[-1]), cells  # the median turn's seconds
