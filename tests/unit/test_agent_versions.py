"""Agent versions side by side (docs/decisions/agent-versions.md): which version a conversation starts on (the ramp's
shares), that it keeps it (the conversation store), the ramp's table, the topics and groups of a version, and the
guard starting a turn on its conversation's version, over real (SQLite) stores."""

from __future__ import annotations

import time

import pytest
import typer
from pydantic import ValidationError

from roundtrip._cli.main import _refuse_unfit
from roundtrip._guard.conversations import Conversations
from roundtrip._guard.ledger import Ledger
from roundtrip._guard.replies import Replies
from roundtrip._guard.rules import Policy
from roundtrip._guard.versions import Ramp, assign
from roundtrip._kernel.kafka.admin import desired_topics
from roundtrip._kernel.settings import ConfigurationError, Settings
from roundtrip._kernel.storage.versions import RampRefused, Shares, Versions
from roundtrip._kernel.wire import topics, topology
from roundtrip._kernel.wire.events import CallModel, StartTurn, Turn
from tests.cores import guard as guard_of
from tests.databases import migrated
from tests.prices import price_table

IDS = [f"conv_{i}" for i in range(10_000)]


def shares_of(given: dict[str, float]) -> dict[str, float]:
    """The share of IDS each version gets (percent)."""
    counted: dict[str, int] = {}
    for conversation in IDS:
        version = assign(conversation, given)
        counted[version] = counted.get(version, 0) + 1
    return {v: 100 * n / len(IDS) for v, n in counted.items()}


def test_without_a_ramp_every_conversation_starts_on_the_default_version():
    assert shares_of({}) == {"": 100.0}


def test_each_version_takes_about_its_share_of_new_conversations():
    got = shares_of({"v2": 20.0, "v3": 5.0})
    assert 18.5 < got["v2"] < 21.5 and 4 < got["v3"] < 6 and 73.5 < got[""] < 76.5, got
    assert shares_of({"v2": 100.0}) == {"v2": 100.0}


def test_ramping_up_keeps_every_conversation_the_smaller_ramp_sent_to_the_version():
    at_10 = {c for c in IDS if assign(c, {"v2": 10.0}) == "v2"}
    at_30 = {c for c in IDS if assign(c, {"v2": 30.0}) == "v2"}
    assert at_10 < at_30  # a conversation delivered again, or its id reused, meets the same version


async def test_the_ramp_reads_the_shares_at_most_once_a_second_a_pinned_conversation_keeps_its_version():
    reads = []

    async def read() -> Shares:
        reads.append(1)
        return Shares({"v2": 100.0}, frozenset({"v1"}))

    ramp = Ramp(read)
    assert await ramp.version("conv_a", None) == "v2"  # a new conversation: the ramp's
    assert await ramp.version("conv_a", "v3") == "v3"  # a conversation on v3 keeps it
    assert await ramp.version("conv_a", "v1") == "v2"  # one on a draining version moves
    assert len(reads) == 1


async def test_no_conversation_is_assigned_before_the_shares_were_read_once():
    async def read() -> Shares:
        raise OSError("the ledger is away")

    with pytest.raises(OSError):
        await Ramp(read).version("conv_a", None)


@pytest.fixture
async def url(tmp_path):
    return await migrated(f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}")


async def test_a_conversation_keeps_the_version_of_its_first_turn_until_it_is_moved(url):
    store, now = await Conversations.open(url), time.time()
    try:
        assert (await store.claim("conv_a", "cus_1001", "v2", now)).agent_version == "v2"
        assert (await store.claim("conv_a", "cus_1001", "", now)).agent_version == "v2"  # the ramp moved on: it did not
        assert (await store.claim("conv_a", "cus_1002", "", now)).agent_version == "v2"  # someone else's: as it is
        await store.pin("conv_a", "v3")
        assert (await store.claim("conv_a", "cus_1001", "", now)).agent_version == "v3"
        assert (await store.get("conv_a")).agent_version == "v3"
    finally:
        await store.close()


async def test_the_ramp_refuses_more_than_all_new_conversations_and_a_drained_version_takes_none(url):
    store = await Versions.open(url)
    try:
        assert await store.ramp("v2", 20.0) == {"v2": 20.0}
        with pytest.raises(RampRefused, match="v3 can take at most 80 %"):
            await store.ramp("v3", 90.0)
        assert await store.ramp("v3", 80.0) == {"v2": 20.0, "v3": 80.0}
        await store.drain("v2")
        assert await store.shares() == Shares({"v2": 0.0, "v3": 80.0}, frozenset({"v2"}))
        assert await store.ramp("v2", 20.0) == {"v2": 20.0, "v3": 80.0}  # ramped again: it takes them again
        for bad in ("", "v.2", "x" * 41):
            with pytest.raises(RampRefused):
                await store.ramp(bad, 10.0)
        with pytest.raises(RampRefused):
            await store.ramp("v2", 101.0)
        rows = {r.version: r for r in await store.summary()}
        assert (rows[""].share, rows["v2"].share, rows["v3"].share) == (0.0, 20.0, 80.0)
    finally:
        await store.close()


async def test_the_default_version_drains_only_once_the_named_ones_take_every_new_conversation(url):
    store = await Versions.open(url)
    try:
        await store.ramp("v2", 60.0)
        with pytest.raises(RampRefused, match="the named versions take 60 %"):
            await store.drain("")
        await store.ramp("v2", 100.0)
        await store.drain("")
        assert await store.shares() == Shares({"": 0.0, "v2": 100.0}, frozenset({""}))
        ramp = Ramp(store.shares)
        assert await ramp.version("conv_a", "") == "v2"  # a conversation of the default version moves
        await store.ramp("v2", 90.0)  # under all of them: the default version takes the rest again
        assert await store.shares() == Shares({"v2": 90.0}, frozenset())
        with pytest.raises(RampRefused, match="is the default version"):
            await store.ramp("default", 10.0)
    finally:
        await store.close()


async def test_the_guard_starts_a_turn_on_its_conversations_version_and_records_it(url):
    ledger, conversations = await Ledger.open(url), await Conversations.open(url)
    sent: list[CallModel] = []

    async def publish(topic, message, conversation_id):
        if isinstance(message, CallModel):
            sent.append(message)

    guard = guard_of(
        ledger=ledger,
        policy=Policy(replies=Replies()),
        prices=price_table(),
        publish=publish,
        conversations=conversations,
        agent_digest="digest-of-v1",
    )
    try:
        await ledger.ramp("v2", 100.0)
        turn = Turn(turn_id="turn_1", request_id="req_1", conversation_id="conv_1", customer_id="cus_1001")
        assert await guard.starts.on_start(StartTurn(turn=turn, text="hi")) == "started"
        (call,) = sent
        assert (call.turn.agent_version, call.turn.agent_digest) == ("v2", "")  # the guard runs v1: no digest of v2
        assert (await ledger.get("turn_1")).agent_version == "v2"
        assert (await conversations.get("conv_1")).agent_version == "v2"
        rows = {r.version: r for r in await ledger.summary()}
        assert rows["v2"].running == 1 and rows[""].running == 0
    finally:
        await guard.outbox.drain()
        await ledger.close()
        await conversations.close()


def test_the_default_version_keeps_todays_topics_and_groups_and_another_has_its_own():
    assert topology.version_topics("") == ()
    assert topology.version_topics("v2") == (
        "turn.model_calls.version.v2",
        "turn.tool_calls.version.v2",
        "turn.tool_batches.version.v2",
    )
    assert topology.of_version(topics.ITERATIONS, "v2") == topics.ITERATIONS  # the guard's own input is shared
    assert topology.VERSIONED == (topics.MODEL_CALLS, topics.TOOL_CALLS, topics.TOOL_BATCHES)
    assert topology.group("model", prefix="p.") == "p.roundtrip-model"
    assert topology.group("model", prefix="p.", version="v2") == "p.roundtrip-model.version.v2"
    assert topology.versioned() == ("model", "gate", "executor")
    wanted = desired_topics("p.", 3, 5, versions=("v2",))
    assert wanted["p.turn.tool_batches.version.v2"] == 5 and wanted["p.turn.model_calls.version.v2"] == 3
    assert set(desired_topics("p.", 3, 5, ())) == {k for k in wanted if ".version." not in k}


def test_a_version_is_a_setting_of_a_model_gate_or_executor_only():
    with pytest.raises(ValidationError):
        Settings(agent_version="v.2")
    settings = Settings(agent_version="v2")
    with pytest.raises(ConfigurationError, match="the guard serves every agent version"):
        _refuse_unfit(settings, topology.service("guard"), holds_calls=False)


def test_roundtrip_up_runs_each_version_given_as_name_and_agent():
    from roundtrip._cli.up import _versions
    from roundtrip._fleet.launcher import _is_service

    assert _versions(["v2=pkg.agent:AGENT_V2"]) == {"v2": {"ROUNDTRIP_AGENT": "pkg.agent:AGENT_V2"}}
    for bad in ("v2", "v.2=pkg.agent:AGENT", "=pkg.agent:AGENT"):
        with pytest.raises(typer.BadParameter):
            _versions([bad])
    assert _is_service("model@v2") and _is_service("executor-2") and not _is_service("simulator")
