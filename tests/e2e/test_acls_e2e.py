"""Least privilege on a real cluster (issue 20): each service runs as its own SCRAM principal, on a broker whose
StandardAuthorizer denies whatever no ACL allows, with exactly the ACLs `roundtrip acls --apply` derives from the
topology; turns of the user's app (its own principal, its own consumer group) get their replies, the console reads,
re-drives and records a dead letter as its own principal, and the executor's principal is refused when it writes a
signed batch to turn.tool_batches, reads support.requests or writes another service's dead letters.
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
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import TopicAuthorizationFailedError

from roundtrip._broker.embedded import free_port
from roundtrip._broker.secured import ADMIN_PASSWORD, ADMIN_USER, AUTHORIZER, Listener, secured_kafka
from roundtrip._kernel.kafka import acls
from roundtrip._kernel.kafka.aiokafka_seam import partitions_of
from roundtrip._kernel.wire import topics, topology
from roundtrip._kernel.wire.events import (
    SupportReply,
)
from tests.databases import migrated
from tests.e2e import forgeries
from tests.processes import start_service

MECHANISM = "SCRAM-SHA-256"
PRINCIPALS = (*topology.names(), "operator", "app")
PASSWORDS = {f"roundtrip-{name}": f"{name}-{uuid.uuid4().hex[:12]}" for name in PRINCIPALS}
PREFIX = "acl."
APP_GROUP = "acme-support-app"


@pytest.fixture
def authorizing_broker(tmp_path):
    listener = Listener("SCRAM", "SASL_PLAINTEXT", free_port(), (MECHANISM,))
    kafka = secured_kafka(
        tmp_path / "kafka",
        [listener],
        None,
        PASSWORDS,
        controller_port=free_port(),
        die_with_parent=True,
        properties={"authorizer.class.name": AUTHORIZER},
    )  # super users: the broker's own (secured.py)
    with kafka:  # started, and stopped at the end (EmbeddedKafka is its own context manager)
        kafka.wait_ready(120)
        yield kafka


def as_principal(env: dict[str, str], user: str, password: str | None = None) -> dict[str, str]:
    return env | {
        "ROUNDTRIP_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "ROUNDTRIP_KAFKA_SASL_MECHANISM": MECHANISM,
        "ROUNDTRIP_KAFKA_SASL_USERNAME": user,
        "ROUNDTRIP_KAFKA_SASL_PASSWORD": password or PASSWORDS[user],
    }


def client_security(user: str) -> dict:
    """What a plain aiokafka client of this principal passes (the user's app, the executor's credentials)."""
    return {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": MECHANISM,
        "sasl_plain_username": user,
        "sasl_plain_password": PASSWORDS[user],
    }


def roundtrip(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "roundtrip._cli.main", *args], env=env, capture_output=True, text=True, timeout=120
    )


async def ask(bootstrap: str, texts: list[str]) -> dict[str, SupportReply]:
    """The user's app: publish requests as `roundtrip-app`, read the replies in its own consumer group."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **client_security("roundtrip-app"))
    consumer = AIOKafkaConsumer(
        PREFIX + topics.SUPPORT_REPLIES,
        bootstrap_servers=bootstrap,
        group_id=APP_GROUP,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        **client_security("roundtrip-app"),
    )
    await producer.start()
    await consumer.start()
    replies: dict[str, SupportReply] = {}
    try:
        wanted = []
        for i, text in enumerate(texts):
            request = {
                "request_id": f"req_acl_{i}_{uuid.uuid4().hex[:6]}",
                "conversation_id": f"conv_acl_{i}_{uuid.uuid4().hex[:6]}",
                "customer_id": "cus_1001",
                "text": text,
                "persona": "careful",
            }
            wanted.append(request["request_id"])
            await producer.send_and_wait(
                PREFIX + topics.SUPPORT_REQUESTS, json.dumps(request).encode(), key=request["conversation_id"].encode()
            )
        async with asyncio.timeout(120):
            async for record in consumer:
                reply = SupportReply.model_validate_json(record.value)
                replies[reply.request_id] = reply
                if all(w in replies for w in wanted):
                    return {w: replies[w] for w in wanted}
    finally:
        await consumer.stop()
        await producer.stop()
    raise AssertionError("unreachable")


async def console_redrives_a_dead_letter(bootstrap: str, port: str) -> tuple[int, int]:
    """As the console's principal: a malformed request the app published is dead-lettered by the gateway; the console
    reads it (roundtrip.dead_letters.by.gateway, no group), re-drives it (roundtrip.dead_letters.handled, then
    support.requests, once it has read the record back from there: the gateway dead-letters it again) and refuses a
    second re-drive. Returns the two posts' statuses."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **client_security("roundtrip-app"))
    await producer.start()
    try:
        await producer.send_and_wait(PREFIX + topics.SUPPORT_REQUESTS, b"not json", key=b"conv_acl_junk")
    finally:
        await producer.stop()
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=15) as http, asyncio.timeout(60):

        async def waiting() -> list[str]:
            return re.findall(
                r'data-letter="([^"]+)" data-state="waiting"', (await http.get("/dead-letters/live")).text
            )

        while not (letters := await waiting()):
            await asyncio.sleep(0.5)  # poll interval: the gateway dead-lettering the record
        page = await http.get("/dead-letters")
        token = re.search(r"roundtrip_csrf=([^;]+)", page.headers["set-cookie"]).group(1)  # a Secure cookie
        statuses = []
        for _ in range(2):
            answer = await http.post(
                f"/dead-letters/{letters[0]}/redrive",
                data={"csrf": token},
                headers={"Cookie": f"roundtrip_csrf={token}"},
            )
            statuses.append(answer.status_code)
        while letters[0] in (again := await waiting()) or not again:  # the re-driven record, dead-lettered again
            await asyncio.sleep(0.5)  # a poll interval: the console's page is all there is to ask
    return statuses[0], statuses[1]


async def everything_on(bootstrap: str, names: list[str]) -> list[bytes]:
    """Every record on these topics, from their start to their end now, read as the operator (who may read all)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, **client_security("roundtrip-operator")
    )
    await consumer.start()
    try:
        partitions = await partitions_of(consumer, [PREFIX + name for name in names])
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        values: list[bytes] = []
        async with asyncio.timeout(30):
            while [tp for tp, end in ends.items() if await consumer.position(tp) < end]:
                for records in (await consumer.getmany(timeout_ms=1_000)).values():
                    values += [r.value for r in records]
        return values
    finally:
        await consumer.stop()


async def executor_overreaches(bootstrap: str) -> tuple[type[BaseException] | None, dict, dict[str, int]]:
    """As the executor's principal: forge a batch on turn.tool_batches; read the customers' requests (from the start,
    in its own group); ask the cluster about both topics. Returns the send's error, what was read, and the error
    code the cluster answers for each topic (29: TOPIC_AUTHORIZATION_FAILED)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **client_security("roundtrip-executor"))
    await producer.start()
    forged: type[BaseException] | None = None
    try:
        await producer.send_and_wait(PREFIX + topics.TOOL_BATCHES, b'{"forged": true}', key=b"conv")
    except TopicAuthorizationFailedError as exc:
        forged = type(exc)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=PREFIX + "roundtrip-executor",
        enable_auto_commit=False,
        **client_security("roundtrip-executor"),
    )
    await consumer.start()
    try:
        consumer.assign([TopicPartition(PREFIX + topics.SUPPORT_REQUESTS, p) for p in range(2)])
        read = await consumer.getmany(timeout_ms=5_000)
    finally:
        await consumer.stop()
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **client_security("roundtrip-executor"))
    await admin.start()
    try:
        described = await admin.describe_topics([PREFIX + topics.SUPPORT_REQUESTS, PREFIX + topics.TOOL_BATCHES])
    finally:
        await admin.close()
    return forged, read, {t["topic"].removeprefix(PREFIX): t["error_code"] for t in described}


async def executor_writes_dead_letters(bootstrap: str) -> dict[str, type[BaseException] | None]:
    """As the executor's principal: a dead letter on its own topic, the guard's and the shared one of older fleets.
    Returns each send's error (None: taken)."""
    letter = b'{"forged": "a StartTurn for another customer"}'
    names = (topics.dead_letters("executor"), topics.dead_letters("guard"), topics.DEAD_LETTERS)
    return await forgeries.each_sent(lambda: executor_producer(bootstrap), PREFIX, dict.fromkeys(names, letter))


STALE = acls.Acl("User:roundtrip-executor", "topic", PREFIX + topics.DEAD_LETTERS, ("Write",))  # an older fleet's
KEPT = [
    acls.Acl("User:someone-else", "topic", PREFIX + topics.SUPPORT_REQUESTS, ("Read",)),  # not a principal of ours
    acls.Acl("User:roundtrip-executor", "topic", "other." + topics.TOOL_BATCHES, ("Read",)),  # another fleet's name
]


async def admin_client(bootstrap: str, work):
    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism=MECHANISM,
        sasl_plain_username=ADMIN_USER,
        sasl_plain_password=ADMIN_PASSWORD,
    )
    await admin.start()
    try:
        return await work(admin)
    finally:
        await admin.close()


async def held(bootstrap: str, principal: str) -> set:
    return await admin_client(bootstrap, lambda admin: acls.held(admin, principal))


def executor_producer(bootstrap: str) -> AIOKafkaProducer:
    return AIOKafkaProducer(bootstrap_servers=bootstrap, **client_security("roundtrip-executor"))


async def test_the_fleet_runs_with_exactly_its_acls_and_the_executor_is_refused_the_rest(authorizing_broker, tmp_path):
    bootstrap = authorizing_broker.bootstrap
    ledger_url = f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROUNDTRIP_")} | {
        "ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "ROUNDTRIP_TOPIC_PREFIX": PREFIX,
        "ROUNDTRIP_STATE_DIR": str(tmp_path),
        "ROUNDTRIP_LEDGER_DATABASE_URL": ledger_url,
        "ROUNDTRIP_ENV": "development",
        "ROUNDTRIP_PARTITIONS": "2",
        "ROUNDTRIP_SIMULATOR_PORT": str(free_port()),
        "ROUNDTRIP_CONSOLE_PORT": str(free_port()),
        "ROUNDTRIP_SHOP_PORT": str(free_port()),
        "PYTHONUNBUFFERED": "1",
    }
    # a service's first step in its pod: before the ACLs it waits, then says in one line what it cannot see
    executor = as_principal(env, "roundtrip-executor")
    early = roundtrip(executor, "topics", "wait", "executor", "--timeout", "1")
    assert early.returncode == 1, early.stdout + early.stderr
    (line,) = early.stderr.splitlines()
    assert f"executor still cannot see {PREFIX}{topics.TOOL_BATCHES} (not authorized)" in line, line
    # a grant an older version needed (the shared dead letters), and two that are not this fleet's to take back
    await admin_client(bootstrap, lambda admin: acls.apply(admin, {"before": [STALE, *KEPT]}))
    applied = roundtrip(as_principal(env, ADMIN_USER, ADMIN_PASSWORD), "acls", "--apply", "--app-group", APP_GROUP)
    assert applied.returncode == 0, applied.stderr
    assert "ACL bindings added" in applied.stdout
    removed = [line for line in applied.stdout.splitlines() if line.startswith("removed")]
    assert removed == [f"removed, beyond what it needs: {STALE.principal}: Write on topic {STALE.name}"], removed
    for acl in KEPT:
        assert acls.bindings([acl]) <= await held(bootstrap, acl.principal), acl
    made = roundtrip(as_principal(env, "roundtrip-operator"), "topics", "create")  # the operator's ACLs make the topics
    assert made.returncode == 0, made.stdout + made.stderr
    waited = roundtrip(executor, "topics", "wait", "executor", "--timeout", "30")
    assert waited.returncode == 0 and "of executor are there" in waited.stdout, waited.stdout + waited.stderr
    await migrated(ledger_url)

    procs = []
    try:
        for name in ("simulator", "shop"):  # no Kafka: plain HTTP
            log = open(tmp_path / f"{name}.log", "ab")  # noqa: SIM115 - the child writes to it as long as it runs
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "roundtrip._cli.main", "run", name],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        for port in (env["ROUNDTRIP_SIMULATOR_PORT"], env["ROUNDTRIP_SHOP_PORT"]):
            await _wait_http(f"http://127.0.0.1:{port}/health")
        for name in topology.names():  # each service as its own principal, with its ACLs and nothing more
            procs.append(start_service(name, as_principal(env, f"roundtrip-{name}"), tmp_path / f"{name}.log"))

        replies = await ask(bootstrap, ["where is my order?", "where is my order?"])
        assert [r.outcome for r in replies.values()] == ["end_turn", "end_turn"], replies

        redriven = await console_redrives_a_dead_letter(bootstrap, env["ROUNDTRIP_CONSOLE_PORT"])
        assert redriven == (303, 409), redriven

        genuine = next(iter(replies.values()))

        ends = await forgeries.sent(lambda: executor_producer(bootstrap), PREFIX, genuine)
        assert ends == dict.fromkeys(ends, TopicAuthorizationFailedError), ends  # each refused by the broker
        # nothing of it on any of those topics, and the app's replies are the genuine ones, each once
        assert not [v for v in await everything_on(bootstrap, list(ends)) if forgeries.FORGED.encode() in v]
        on_replies = map(SupportReply.model_validate_json, await everything_on(bootstrap, [topics.SUPPORT_REPLIES]))
        answered = [r for r in on_replies if r.request_id in replies]
        assert answered == [replies[r.request_id] for r in answered] and len(answered) == len(replies), answered

        forged, read, described = await executor_overreaches(bootstrap)
        assert forged is TopicAuthorizationFailedError  # it cannot write a batch for itself to run
        assert read == {}  # two requests are there, and it reads none of them
        assert described == {topics.SUPPORT_REQUESTS: 29, topics.TOOL_BATCHES: 0}  # its own input it may see
        assert await executor_writes_dead_letters(bootstrap) == {  # only its own: no letter it writes names another's
            topics.dead_letters("executor"): None,
            topics.dead_letters("guard"): TopicAuthorizationFailedError,
            topics.DEAD_LETTERS: TopicAuthorizationFailedError,
        }
        for proc in procs:
            assert proc.poll() is None, f"pid {proc.pid} exited"
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


async def _wait_http(url: str, timeout: float = 60.0) -> None:
    async with httpx.AsyncClient() as http, asyncio.timeout(timeout):
        while True:
            try:
                if (await http.get(url, timeout=1)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.2)  # poll interval: the health port answering
