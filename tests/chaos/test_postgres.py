"""PostgreSQL crashes and outages under load (issue 31): the fleet with ledger, fence and conversations on a PostgreSQL
server of this module's own, which the scenarios SIGKILL, stop for 30 s, and restart fast during a burst of approvals.
The suite's zeros (harness.audit: none lost, no duplicated reply, no duplicate or late side effect) and one more: not
one message dead-lettered, since an unavailable database is a reason to wait (services/_kernel/kafka/faults.py), never
to dead-letter. Every cancellation waits for a person here (above 5.00 EUR), approved by `Approver` as it is asked.

Run: .venv/bin/python -m pytest -q tests/chaos/test_postgres.py -s
"""

from __future__ import annotations

import asyncio
import json
import signal
import time

import pytest
from aiokafka import AIOKafkaConsumer

from roundtrip._kernel.kafka.aiokafka_seam import partitions_of
from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import ApprovalDecided, Decision
from tests.agents import ShopFleetSettings
from tests.chaos.conftest import _env, fleet_values
from tests.chaos.harness import (
    FAULTY,
    Expect,
    Fault,
    audit,
    deliver_batches_again,
    new_tag,
    plan_load,
    report,
    seed_customers,
)
from tests.databases import PostgresServer, find_pg_bindir
from tests.readers import stop_reader
from tests.signing import pair

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(200)]

REPLY_TIMEOUT_S = 75  # a turn that waited for the database is ended by the stuck rule within ~25 s of its return
DECISION = pair("ops1")  # the people's pair: the Approver signs with it, the fleet verifies


@pytest.fixture(scope="module")
def database():
    """A PostgreSQL server of the module's own (the scenarios kill it), its commits surviving a SIGKILL of it."""
    bindir = find_pg_bindir()
    if bindir is None:
        pytest.fail("PostgreSQL server binaries not found (see tests/conftest.py's postgres_url)", pytrace=False)
    server = PostgresServer(bindir, crash_safe=True)
    url = server.start()
    yield server, url
    server.stop()


@pytest.fixture(scope="module")
def chaos_settings(chaos_kafka, database, tmp_path_factory):
    """The suite's fleet settings (tests/chaos/conftest.py, whose chaos_fleet and observer use these) on `database`."""
    url = database[1]
    values = fleet_values(
        chaos_kafka.bootstrap,
        tmp_path_factory.mktemp("chaos-fleet-pgdown"),
        ledger_database_url=url,
        conversations_database_url=url,
        database_allow_shared_login=True,  # one (superuser) login for the fleet, on purpose
        approval_cancel_above_cents=500,
        approval_timeout_s=120,
        decision_signing_key=DECISION.signing,
        decision_verify_keys=DECISION.verify,
    )
    return ShopFleetSettings(**values), _env(**values)


class Approver:
    """A person approving every call that waits, as soon as it is asked (turn.approval_requests -> decisions)."""

    def __init__(self, settings, observer) -> None:
        self.settings, self.observer, self.asked, self.decided = settings, observer, 0, 0
        self.signer = DECISION.signer

    async def __aenter__(self) -> Approver:
        self.consumer = AIOKafkaConsumer(bootstrap_servers=self.settings.bootstrap_servers, enable_auto_commit=False)
        await self.consumer.start()
        self.consumer.assign(
            await partitions_of(self.consumer, [self.settings.topic_prefix + topics.APPROVAL_REQUESTS])
        )
        self.task = asyncio.create_task(self._approve())
        return self

    async def __aexit__(self, *exc) -> None:
        await stop_reader(self.task, self.consumer)

    async def _approve(self) -> None:
        async for record in self.consumer:
            request = json.loads(record.value)
            self.asked += 1
            decision = ApprovalDecided(
                approval_id=request["approval_id"],
                turn_id=request["turn"]["turn_id"],
                tool_use_id=request["call"]["id"],
                input_sha256=request["input_sha256"],
                decision=Decision.APPROVE,
                decided_by="chaos@support",
                decided_at=time.time(),
            )
            signed = self.signer.sign(decision).model_dump_json().encode()
            await self.observer.send(topics.APPROVAL_DECISIONS, signed, record.key)  # retried while the broker is away
            self.decided += 1


@pytest.fixture(scope="module")
async def approver(chaos_fleet, chaos_settings, observer):
    async with Approver(chaos_settings[0], observer) as a:
        yield a


async def _run(name, database, chaos_settings, observer, capsys, fault, requests=40, rate=5.0):
    """Drive the load while `fault(server)` runs (it returns the Fault it made), audit, assert."""
    settings = chaos_settings[0]
    started = time.monotonic()
    tag = new_tag(name.split()[0].lower())
    customers = await seed_customers(settings, tag, 12)
    plan = plan_load(tag, customers, conversations=20, requests=requests)
    letters_before = len(observer.seen.dead_letters)
    load = asyncio.create_task(observer.drive(plan, rate_per_s=rate))
    made = await fault(database[0])
    await deliver_batches_again(observer, settings, plan)
    await load
    await observer.wait_for_replies([p.request.request_id for p in plan], timeout=REPLY_TIMEOUT_S, linger_s=3)
    expect = Expect(FAULTY, side_effects=len(plan) // 5, in_flight=2)
    result = await audit(name, settings, observer, plan, started, expect=expect, faults=[made])
    report(result, capsys)
    letters = observer.seen.dead_letters[letters_before:]
    assert not letters, f"{len(letters)} dead-lettered: " + "; ".join(
        f"{d['topic']}: {d['reason'][:120]}" for d in letters[:5]
    )
    return result


async def test_postgres_sigkilled_mid_load_and_restarted(database, chaos_settings, observer, approver, capsys):
    async def fault(server: PostgresServer) -> Fault:
        await asyncio.sleep(3)  # turns in flight before the fault
        at = time.time()
        await asyncio.to_thread(server.halt, signal.SIGKILL)  # postmaster and backends: a crash, then crash recovery
        await asyncio.sleep(5)  # down 5 s while turns are in flight
        await asyncio.to_thread(server.resume)
        return Fault("PostgreSQL SIGKILLed", at, time.time())

    await _run("PostgreSQL SIGKILLed mid-load", database, chaos_settings, observer, capsys, fault)


async def test_postgres_unreachable_for_30_s(database, chaos_settings, observer, approver, capsys):
    async def fault(server: PostgresServer) -> Fault:
        await asyncio.sleep(3)  # turns in flight before the fault
        at = time.time()
        await asyncio.to_thread(server.halt, signal.SIGINT)  # stopped: every connection refused for 30 s
        await asyncio.sleep(30)  # the 30 s of the outage the test is named for
        await asyncio.to_thread(server.resume)
        return Fault("PostgreSQL stopped", at, time.time())

    await _run("PostgreSQL unreachable 30 s", database, chaos_settings, observer, capsys, fault, requests=30, rate=6)


async def test_postgres_fast_restart_during_a_burst_of_approvals(database, chaos_settings, observer, approver, capsys):
    asked = approver.asked

    async def fault(server: PostgresServer) -> Fault:
        await observer.wait_for(
            lambda: approver.asked >= asked + 5, timeout=30, what="five approvals asked"
        )  # decisions coming in
        at = time.time()
        await asyncio.to_thread(server.halt, signal.SIGINT)
        await asyncio.to_thread(server.resume)  # a fast restart: down for about a second
        return Fault("PostgreSQL restarted", at, time.time())

    await _run("PostgreSQL fast restart during approvals", database, chaos_settings, observer, capsys, fault, rate=10)
    assert approver.decided > asked + 5, "the burst should have had approvals"
