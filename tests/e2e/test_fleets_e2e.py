"""Two fleets on one broker, told apart by their topic prefix, share nothing but the broker: both serve, each reply
reaches its own fleet's replies topic only, `roundtrip lag` of each shows its own groups and members only, and
killing one fleet's executor starts no rebalance in the other (its groups keep their generation and their members).

The session's fleet is one; the other (prefix `other<hex>.`) is started here against the same broker, with its own
state folder and ledger, and the session fleet's simulator and shop (the model and the backend are not what is
under test, and two fewer processes share the CPU)."""

from __future__ import annotations

import asyncio
import json
import os
import struct
import sys
import time
import uuid

import pytest
from aiokafka import AIOKafkaConsumer

from roundtrip._broker.embedded import free_port
from roundtrip._fleet.launcher import Fleet
from roundtrip._kernel.kafka.admin import consumer_lag
from roundtrip._kernel.kafka.aiokafka_seam import partitions_of
from roundtrip._kernel.wire import topics, topology
from roundtrip._kernel.wire.events import Outcome
from tests.agents import ShopFleetSettings
from tests.e2e.conftest import AsyncFleet, FleetClient, fleet_env
from tests.signing import key_settings

OTHER_EXECUTORS = 1
OTHER_PREFIX = f"other{uuid.uuid4().hex[:6]}."


@pytest.fixture(scope="module")
def other_fleet(fleet, fleet_settings, tmp_path_factory):
    """A second fleet on the session's broker: another prefix, its own state (ledger, logs), the same model and shop."""
    session = fleet_settings[0]
    values = dict(
        kafka_bootstrap_servers=session.bootstrap_servers,
        kafka_allow_plaintext=True,  # the test broker listens in the clear; the fleet is not development
        topic_prefix=OTHER_PREFIX,
        state_dir=tmp_path_factory.mktemp("other-fleet"),
        anthropic_base_url=f"http://127.0.0.1:{session.simulator_port}",
        shop_url=session.shop_base_url,
        console_port=free_port(),
        partitions=2,
        max_steps=10,
        log_level="INFO",
        **key_settings("oth1"),  # fresh pairs, never the published development keys
    )
    settings, env = ShopFleetSettings(**values), fleet_env(**values)
    with Fleet(settings, env=env, executor_replicas=OTHER_EXECUTORS) as running:
        yield AsyncFleet(running), settings, env


@pytest.fixture(scope="module")
async def other_client(other_fleet):
    c = FleetClient(other_fleet[1])
    await c.start()
    yield c
    await c.stop()


def _expected_members(fleet: Fleet) -> dict[str, int]:
    """Each consumer group of `fleet` -> how many of its processes are members: one per service, its executors."""
    prefix = fleet.settings.topic_prefix
    return {
        i.group(s.name, prefix): fleet.executor_replicas if s.name == "executor" else 1
        for s in topology.SERVICES
        for i in s.inputs
    }


async def _lag_cli(env: dict[str, str]) -> dict:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "roundtrip._cli.main",
        "lag",
        "--json",
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 90)
    assert process.returncode == 0, err.decode()
    return json.loads(out)


def _group_generation(key: bytes | None, value: bytes | None) -> tuple[str, int] | None:
    """(group, generation) of a group-metadata record of __consumer_offsets (key version 2, GroupMetadataValue
    versions 0-4, flexible from 4), None for any other record (offset commits, tombstones)."""
    if key is None or value is None or struct.unpack_from(">h", key)[0] != 2:
        return None
    (length,) = struct.unpack_from(">h", key, 2)
    group = key[4 : 4 + length].decode()
    (version,) = struct.unpack_from(">h", value)
    if version >= 4:  # a compact string: unsigned varint of length + 1
        at, shift, encoded = 2, 0, 0
        while True:
            byte = value[at]
            encoded |= (byte & 0x7F) << shift
            at, shift = at + 1, shift + 7
            if not byte & 0x80:
                break
        at += encoded - 1
    else:
        at = 4 + struct.unpack_from(">h", value, 2)[0]
    return group, struct.unpack_from(">i", value, at)[0]


async def _generations(bootstrap: str, groups: set[str]) -> dict[str, int]:
    """The latest generation of each of `groups`, as its coordinator recorded it in __consumer_offsets (a rebalance
    writes the next one): what no DescribeGroups answer carries."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, exclude_internal_topics=False)
    await consumer.start()
    found: dict[str, int] = {}
    try:
        partitions = await partitions_of(consumer, ["__consumer_offsets"])
        assert partitions, "the broker should have its offsets topic"
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        pending = {tp for tp in partitions if ends[tp] > 0}
        while pending:
            for records in (await consumer.getmany(*pending, timeout_ms=1000)).values():
                for record in records:
                    if (parsed := _group_generation(record.key, record.value)) and parsed[0] in groups:
                        found[parsed[0]] = parsed[1]
            pending = {tp for tp in pending if await consumer.position(tp) < ends[tp]}
    finally:
        await consumer.stop()
    return found


async def _members(bootstrap: str, prefix: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Each group of the fleet of `prefix` -> (its state, its member ids)."""
    report = await consumer_lag(bootstrap, prefix, None)
    return {g.group: (g.state, tuple(sorted(m.member_id for m in g.members))) for g in report}


async def test_both_fleets_serve_and_each_reply_reaches_its_own_fleet_only(client, other_client, other_fleet):
    asked = {"session": [], "other": []}
    for i in range(3):  # several at once, on both fleets
        asked["session"].append(
            await client.ask(
                "where is my order?", "cus_1001", persona="careful", request_id=f"req_one_{i}_{uuid.uuid4().hex[:6]}"
            )
        )
        asked["other"].append(
            await other_client.ask(
                "where is my order?", "cus_1001", persona="careful", request_id=f"req_two_{i}_{uuid.uuid4().hex[:6]}"
            )
        )
    replies = await asyncio.gather(
        *(client.reply(r, 90) for r in asked["session"]), *(other_client.reply(r, 90) for r in asked["other"])
    )
    assert all(reply.outcome is Outcome.END_TURN and reply.text for reply in replies), [
        (r.outcome, r.text) for r in replies
    ]
    # both fleets settled: a reply that went astray would be on the other fleet's replies topic, and in its `seen`
    await asyncio.gather(client.settled(), other_client.settled())
    assert not set(asked["other"]) & set(client.replies), (
        "the session fleet's replies topic got the other fleet's reply"
    )
    assert not set(asked["session"]) & set(other_client.replies), (
        "the other fleet's replies topic got the session fleet's reply"
    )
    assert all(len(client.replies[r]) == 1 for r in asked["session"]) and all(
        len(other_client.replies[r]) == 1 for r in asked["other"]
    )
    for request_id in asked["other"]:  # no service of the session fleet started the other fleet's turns
        assert not client.of_turn(topics.TURN_STARTS, request_id) and other_client.of_turn(
            topics.TURN_STARTS, request_id
        )


async def test_lag_of_each_fleet_shows_its_own_groups_and_members_only(fleet, fleet_settings, other_fleet):
    for running, env in ((fleet.sync, fleet_settings[1]), (other_fleet[0].sync, other_fleet[2])):
        prefix = running.settings.topic_prefix
        groups = {g["group"]: g for g in (await _lag_cli(env))["groups"]}
        expected = _expected_members(running)
        assert set(groups) == set(expected), f"{prefix}: lag shows {sorted(set(groups) ^ set(expected))} beyond its own"
        assert all(p["topic"].startswith(prefix) for g in groups.values() for p in g["partitions"])
        for name, members in expected.items():
            assert len(groups[name]["members"]) == members, (name, groups[name]["members"])
            assigned = [p["topic"] for m in groups[name]["members"] for p in m["partitions"]]
            assert assigned and all(t == prefix + topology.groups(prefix)[name] for t in assigned), (name, assigned)


async def test_killing_one_fleets_executor_rebalances_no_group_of_the_other(fleet, fleet_settings, other_fleet):
    session, (other, _, _) = fleet.sync.settings, other_fleet
    bootstrap = session.bootstrap_servers
    mine = set(topology.groups(session.topic_prefix))
    its_executor = topology.group("executor", prefix=OTHER_PREFIX)
    before_members = await _members(bootstrap, session.topic_prefix)
    assert all(state == "Stable" for state, _ in before_members.values()), before_members
    before = await _generations(bootstrap, mine | {its_executor})
    assert set(before) == mine | {its_executor}, (
        f"no generation recorded for {sorted(mine | {its_executor} - set(before))}"
    )

    await other.kill("executor")  # SIGKILL: its group learns of it when the member's session times out
    seen_states: set[str] = set()
    deadline = time.monotonic() + 60
    while (await _generations(bootstrap, {its_executor}))[its_executor] == before[its_executor]:
        assert time.monotonic() < deadline, (
            "the other fleet's executor group never rebalanced: the probe would see nothing"
        )
        seen_states |= {state for state, _ in (await _members(bootstrap, session.topic_prefix)).values()}
        await asyncio.sleep(0.2)  # poll interval: the group members' states while the group settles
    await asyncio.sleep(3.5)  # a heartbeat interval: a rebalance the kill started elsewhere would have begun
    seen_states |= {state for state, _ in (await _members(bootstrap, session.topic_prefix)).values()}

    after = await _generations(bootstrap, mine)
    assert after == {g: before[g] for g in mine}, "a group of the session fleet rebalanced"
    assert await _members(bootstrap, session.topic_prefix) == before_members
    assert seen_states == {"Stable"}
