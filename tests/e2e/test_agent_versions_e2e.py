"""Agent versions side by side (issue 54), end to end: the demo shop agent as the default version and its version 2
(another system prompt, its help center search renamed: tests/shop_v2_agent.py), each with a model, gate and executor
of its own, the guard, gateway and ledger shared. `roundtrip versions ramp v2 20%` sends a fifth of 300 new
conversations to v2: every model call of every turn carried the prompt and tools of its turn's version (the simulator
records what it was sent), the shares are within a binomial bound, a conversation's later turn stays on its first
turn's version after the ramp moved on, every turn got one reply, another customer cannot enter a v2 conversation, and
`roundtrip versions` shows both versions' turns; drained, v2 gets no turn: its conversations move on.

Under load (conversations asking turn after turn meanwhile): v2's model, gate and executor restarted one by one as a
rolling deploy does (SIGTERM, started again) lose no turn and move none; ramped to 100 %, then the default version
drained, every request gets one reply, the default version's conversations keep it until the drain, new ones go to
v2, and once the drain says so its services stop with nothing lost. On v2's own topics, a model call rewritten to
another customer and a batch the gate did not sign are refused by v2's services. One fleet serves every test of the
module.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import httpx
import pytest

from roundtrip._broker.embedded import free_port
from roundtrip._fleet.launcher import Fleet
from roundtrip._guard.versions import assign
from roundtrip._kernel.storage.ledger_reads import TurnReads
from roundtrip._kernel.storage.versions import DEFAULT, Versions
from roundtrip._kernel.wire import topics, topology
from roundtrip._kernel.wire.events import CallModel, CheckedCall, ExecuteToolBatch, Outcome, Turn
from roundtrip._shop.agent import AGENT as V1
from tests.agents import ShopFleetSettings
from tests.e2e.conftest import FleetClient, fleet_env
from tests.shop_v2_agent import AGENT as V2
from tests.signing import key_settings

CUSTOMER, OTHER = "cus_1001", "cus_1002"
CONVERSATIONS = [f"conv_{i}" for i in range(300)]  # fixed ids: their buckets, so the shares they get, are fixed too
CALLS_A_TURN = 2  # the `direct` persona's lookup, then its answer
UNLIKELY = 1e-6  # the chance a fair draw of the versions falls below the share bounds (and above them)
REPLY_TIMEOUT_S = 180  # a turn of a fleet busy with a restart or a drain, on two contended cores


def binomial_bounds(n: int, p: float) -> tuple[int, int]:
    """The counts of n conversations a version of share p takes, but for a chance of UNLIKELY on each side (the
    conversations' buckets are a hash: their count is what a fair draw of n gives)."""
    chance = [math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(n + 1)]
    low = next(k for k in range(n + 1) if sum(chance[: k + 1]) > UNLIKELY)
    high = next(k for k in range(n, -1, -1) if sum(chance[k:]) > UNLIKELY)
    return low, high


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
    versions = {"v2": {"ROUNDTRIP_AGENT": "roundtrip._shop.agent.v2:AGENT"}}  # as `roundtrip up --version` runs it
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
    low, high = binomial_bounds(len(CONVERSATIONS), 0.2)
    assert low <= len(on_v2) <= high, f"{len(on_v2)} of {len(CONVERSATIONS)} conversations on v2 at a 20 % ramp"
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


# -- under load: a rolling restart of v2's services, a ramp to 100 % and a drain of the default version -------------


def question(conversation: str, k: int) -> str:
    """Turn k of a conversation: an order id naming both, so the simulator's record of each call says whose it is."""
    return f'lookup_order {{"order_id": "ord_{conversation}.{k}"}}'


def turn_asked(body: dict) -> tuple[str, int] | None:
    """(conversation, k) of the turn a model call belongs to: its last customer's message is that turn's question."""
    said = [text_of(m["content"]) for m in body["messages"] if m["role"] == "user" and text_of(m["content"])]
    if not said or '"ord_' not in said[-1]:
        return None
    conversation, _, k = said[-1].split('"ord_', 1)[1].split('"', 1)[0].rpartition(".")
    return (conversation, int(k)) if k.isdigit() else None


def calls_by_turn(requests: list[dict]) -> dict[tuple[str, int], list[str]]:
    """(conversation, k) -> the version each model call of that turn was made by."""
    found: dict[tuple[str, int], list[str]] = {}
    for request in requests:
        if (turn := turn_asked(request["body"])) is not None:
            found.setdefault(turn, []).append(version_sent(request["body"]))
    return found


@dataclass
class Asked:
    conversation: str
    k: int
    request_id: str
    at: float  # time.monotonic() when it was asked
    answered: float = 0.0  # and when its reply came


@dataclass
class Flow:
    """Conversations each asking one turn after another until stopped: requests flowing while the operator acts."""

    client: FleetClient
    asked: list[Asked] = field(default_factory=list)
    last_answered: dict[str, float] = field(default_factory=dict)  # conversation -> when its last answered turn asked
    tasks: list[asyncio.Task] = field(default_factory=list)
    stopping: asyncio.Event = field(default_factory=asyncio.Event)

    def start(self, conversations: list[str]) -> None:
        self.tasks += [asyncio.create_task(self._converse(c)) for c in conversations]

    async def _converse(self, conversation: str) -> None:
        k = 0
        while not self.stopping.is_set():
            at = time.monotonic()
            request_id = await self.client.ask(
                question(conversation, k), CUSTOMER, "direct", conversation_id=conversation
            )
            asked = Asked(conversation, k, request_id, at)
            self.asked.append(asked)
            await self.client.reply(asked.request_id, timeout=REPLY_TIMEOUT_S)
            asked.answered, self.last_answered[conversation] = time.monotonic(), asked.at
            k += 1

    async def answered_since(self, conversations: list[str], moment: float) -> None:
        """Until each of `conversations` has had a turn it asked after `moment` answered."""
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while waiting := [c for c in conversations if self.last_answered.get(c, -1.0) <= moment]:
            for task in self.tasks:
                if task.done():
                    task.result()  # a conversation that stopped early: its reply's timeout, said here
            assert time.monotonic() < deadline, f"no reply since to {waiting}"
            await asyncio.sleep(0.25)  # poll interval: the conversations' replies arriving

    async def stop(self) -> list[Asked]:
        """Every conversation ends after its current turn's reply; every turn asked."""
        self.stopping.set()
        await asyncio.gather(*self.tasks)
        return self.asked


@dataclass
class Heard:
    """Every model call the simulator received while a flow ran: it keeps only its last requests, fewer than a flow
    of a minute makes, so they are read as they come (each numbered: only those after the last read)."""

    fleet: Fleet
    requests: list[dict] = field(default_factory=list)

    def read(self) -> None:
        after = self.requests[-1]["n"] if self.requests else 0
        port = self.fleet.settings.simulator_port
        answer = httpx.get(
            f"http://127.0.0.1:{port}/v1/_received", params={"persona": "direct", "after": after}, timeout=10
        )
        self.requests += answer.json()["requests"]

    async def listen(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.to_thread(self.read)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 2.0)  # a read every 2 s: ~100 calls come between two at most
        await asyncio.to_thread(self.read)


@asynccontextmanager
async def flowing(client: FleetClient, heard: Heard) -> AsyncIterator[Flow]:
    flow, stop = Flow(client), asyncio.Event()
    listening = asyncio.create_task(heard.listen(stop))
    try:
        yield flow
    finally:  # a failed test leaves no conversation asking on
        for task in flow.tasks:
            task.cancel()
        await asyncio.gather(*flow.tasks, return_exceptions=True)
        stop.set()
        await listening


async def run(fleet: Fleet, *args: str) -> subprocess.CompletedProcess:
    """A `roundtrip` command, off the event loop: the flow's replies keep arriving while it runs."""
    return await asyncio.to_thread(roundtrip, fleet, *args)


async def ramped(fleet: Fleet, share: str) -> str:
    done = await run(fleet, "versions", "ramp", "v2", share)
    assert done.returncode == 0, done.stderr + done.stdout
    await asyncio.sleep(1.5)  # the guard reads the ramp again within a second (services/_guard/versions.py)
    return " ".join(done.stdout.split())


async def turn_versions(fleet: Fleet, client: FleetClient, asked: list[Asked]) -> dict[tuple[str, int], str]:
    """(conversation, k) -> the version the ledger recorded for that turn."""
    ledger = await TurnReads.open(fleet.settings.ledger_db_url, read_only=True)
    try:
        rows = {(a.conversation, a.k): await ledger.get(client.replies[a.request_id][0].turn_id) for a in asked}
    finally:
        await ledger.close()
    return {turn: row.agent_version or "" for turn, row in rows.items() if row is not None}


def one_reply_each_and_every_call_on_its_turns_version(
    heard: Heard, client: FleetClient, asked: list[Asked], versions: dict[tuple[str, int], str]
) -> None:
    assert all(len(client.replies[a.request_id]) == 1 for a in asked), "a request answered twice"
    ended = {client.replies[a.request_id][0].outcome for a in asked}
    assert ended == {Outcome.END_TURN}, ended
    assert len(versions) == len(asked)
    calls = calls_by_turn(heard.requests)
    for turn, version in versions.items():  # a call made again after a restart is its turn's, on its version too
        made = calls.get(turn, [])
        assert len(made) >= CALLS_A_TURN and set(made) == {version}, (turn, version, made)


def stop_gracefully(fleet: Fleet, *names: str) -> None:
    """SIGTERM processes of the fleet (as a deploy stops pods) and wait until they exited."""
    stopping = [c for c in fleet.children if c.name in names]
    assert len(stopping) == len(names), stopping
    for child in stopping:
        child.process.send_signal(signal.SIGTERM)
    for child in stopping:
        child.process.wait(timeout=60)


def restart(fleet: Fleet, name: str) -> None:
    """A rolling deploy's step: the process stopped with SIGTERM, then started again, and ready."""
    before = next(c.process.pid for c in fleet.children if c.name == name)
    stop_gracefully(fleet, name)
    fleet.respawn(name)
    assert next(c.process.pid for c in fleet.children if c.name == name) != before


async def test_a_rolling_restart_of_v2s_services_while_both_run_loses_nothing_and_moves_no_turn(
    versioned_fleet, client
):
    fleet = versioned_fleet
    heard = Heard(fleet)
    await ramped(fleet, "50%")
    conversations = [f"roll_{i}" for i in range(20)]  # fixed ids: each version gets some
    pinned = {c: assign(c, {"v2": 50.0}) for c in conversations}
    assert set(pinned.values()) == {"", "v2"}, pinned
    try:
        async with flowing(client, heard) as flow:
            flow.start(conversations)
            await flow.answered_since(conversations, time.monotonic())
            for service in topology.versioned():  # model, gate, executor: one by one, the flow going on
                await asyncio.to_thread(restart, fleet, f"{service}@v2")
                await flow.answered_since(conversations, time.monotonic())  # v2's too: it serves again
            asked = await flow.stop()
    finally:
        await asyncio.to_thread(fleet.respawn_exited)  # the fleet whole for what follows

    versions = await turn_versions(fleet, client, asked)
    one_reply_each_and_every_call_on_its_turns_version(heard, client, asked, versions)
    assert versions == {(a.conversation, a.k): pinned[a.conversation] for a in asked}  # each on its first's version


async def default_turns(fleet: Fleet) -> tuple[int, int]:
    """The default version's running turns and all its turns, from the ledger."""
    store = await Versions.open(fleet.settings.ledger_db_url, read_only=True)
    try:
        (row,) = [r for r in await store.summary() if r.version == DEFAULT]
    finally:
        await store.close()
    return row.running, row.running + row.ended


async def test_ramped_to_all_then_the_default_version_drained_under_load_no_turn_is_lost_or_moved(
    versioned_fleet, client
):
    fleet = versioned_fleet
    heard = Heard(fleet)
    await ramped(fleet, "20%")
    old = [f"drain_{i}" for i in range(24)]  # fixed ids: each version gets some
    new = [f"drain_new_{i}" for i in range(8)]
    pinned = {c: assign(c, {"v2": 20.0}) for c in old}
    assert set(pinned.values()) == {"", "v2"}, pinned
    try:
        async with flowing(client, heard) as flow:
            flow.start(old)
            await flow.answered_since(old, time.monotonic())

            # every new conversation to v2 from now on; the default version's conversations keep it
            assert (await ramped(fleet, "100%")).endswith("v2 100 %; the default version 0 %")
            at_all = time.monotonic()
            flow.start(new)
            await flow.answered_since(old + new, at_all)

            # drained while the conversations go on asking: it waits for the default version's running turns
            drain_began = time.monotonic()
            drained = await run(fleet, "versions", "drain", "default", "--timeout", "100")
            drain_ended = time.monotonic()
            said = " ".join(drained.stdout.split())
            assert drained.returncode == 0, drained.stderr + drained.stdout
            assert "(default) runs no turn and gets none: its model, gate and executor may stop" in said, said
            running, at_drain = await default_turns(fleet)
            assert running == 0
            await flow.answered_since(old + new, drain_ended)

            # and they may: stopped, nothing the conversations ask needs them
            await asyncio.to_thread(stop_gracefully, fleet, *topology.versioned())
            await flow.answered_since(old + new, time.monotonic())
            asked = await flow.stop()
        assert await default_turns(fleet) == (0, at_drain)  # no turn started on it after the drain said so
    finally:
        await asyncio.to_thread(fleet.respawn_exited)  # the fleet whole, the default version taking new ones again
        await ramped(fleet, "0")

    versions = await turn_versions(fleet, client, asked)
    one_reply_each_and_every_call_on_its_turns_version(heard, client, asked, versions)
    for conversation in old + new:
        turns = sorted((a for a in asked if a.conversation == conversation), key=lambda a: a.k)
        kept = [versions[conversation, a.k] for a in turns]
        assert kept == sorted(kept), (conversation, kept)  # moved at most once, from the default version to v2
        for a, version in zip(turns, kept, strict=True):
            if conversation in new or pinned[conversation] == "v2" or a.at > drain_ended:
                assert version == "v2", (conversation, a.k, version)
            elif a.answered < drain_began:  # the ramp to 100 % moved none of the default version's conversations
                assert version == "", (conversation, a.k, version)
    on_default_at_all = {a.conversation for a in asked if a.at > at_all and a.answered < drain_began}
    assert {c for c in old if not pinned[c]} <= on_default_at_all  # each asked again after the ramp to 100 %


async def test_a_forged_call_or_batch_on_v2s_own_topics_is_refused_by_v2s_services(versioned_fleet, client):
    """The one-customer and fence checks hold on a version's own topics as on the default's: a model call of a v2
    turn rewritten to another customer is dead-lettered by v2's model service before any call reaches the model,
    and a batch the gate did not sign by v2's executor before any tool runs."""
    fleet = versioned_fleet
    ledger = await TurnReads.open(fleet.settings.ledger_db_url, read_only=True)
    try:
        row = next(r for r in await ledger.list(version="v2", limit=1000) if r.customer_id == CUSTOMER)
    finally:
        await ledger.close()
    bobs = Turn(
        turn_id=row.turn_id,
        request_id=row.request_id,
        conversation_id=row.conversation_id,
        customer_id=OTHER,
        persona="direct",
        agent_version="v2",
    )
    marker = f"forged-{uuid.uuid4().hex[:8]}"
    forged = {  # name -> (v2's topic, the record, the service that must refuse it, what its reason must say)
        "call": (
            topology.of_version(topics.MODEL_CALLS, "v2"),
            CallModel(
                turn=bobs, step=0, messages=[{"role": "user", "content": f'lookup_order {{"order_id": "{marker}"}}'}]
            ),
            "model",
            "customer",
        ),
        "batch": (
            topology.of_version(topics.TOOL_BATCHES, "v2"),
            ExecuteToolBatch(
                turn=bobs.model_copy(update={"customer_id": CUSTOMER}),
                step=1,
                messages=[],
                calls=[CheckedCall(id="toolu_forged", name="cancel_order", input={"order_id": marker}, approved=True)],
                signature="0" * 128,
            ),
            "executor",
            "the gate did not approve it",
        ),
    }
    for name, (topic, record, _, _) in forged.items():
        await client.producer.send_and_wait(
            client.topic(topic), record.model_dump_json().encode(), key=f"{marker}:{name}".encode()
        )

    found = await client.letters_keyed(marker, set(forged))
    for name, (topic, _, service, why) in forged.items():
        letter = found[name]
        assert (letter["service"], letter["topic"]) == (service, client.topic(topic)), (name, letter)
        assert why in letter["reason"].lower(), (name, letter["reason"])
    assert not [r for r in received(fleet) if marker in json.dumps(r["body"])]  # no model call made for it
