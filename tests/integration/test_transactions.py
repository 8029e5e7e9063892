"""Consume-produce-commit in one Kafka transaction, against the real broker."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from roundtrip._kernel.kafka.transactions import TransactionalOutlet
from roundtrip._kernel.wire.events import Outcome, SupportReply, Usage

REPLY = SupportReply(
    request_id="r",
    conversation_id="c",
    customer_id="cus_1001",
    turn_id="t",
    text="hi",
    outcome=Outcome.END_TURN,
    steps=1,
    usage=Usage(),
    cost_usd=0.0,
    trace_id="",
)


async def read_all(bootstrap, topic, isolation):
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        records = await consumer.getmany(tp, timeout_ms=2000)
        return [r.value for r in records.get(tp, [])]
    finally:
        await consumer.stop()


async def committed_offset(consumer, record, timeout=15.0):
    """The group's committed offset, once the transaction's markers are in (Kafka withholds it until then)."""
    tp = TopicPartition(record.topic, record.partition)
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        offset = await consumer.committed(tp)
        if offset is not None or asyncio.get_running_loop().time() > deadline:
            return offset
        await asyncio.sleep(0.2)  # poll interval: the group's committed offset


@pytest.fixture
async def source(kafka_bootstrap, topic_prefix):
    topic_in, topic_out = f"{topic_prefix}in", f"{topic_prefix}out"
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    await producer.send_and_wait(topic_in, b"turn ended", partition=0)
    await producer.send_and_wait(topic_out, b"warm-up", partition=0)  # both topics exist (auto-created)
    await producer.stop()
    consumer = AIOKafkaConsumer(
        topic_in,
        bootstrap_servers=kafka_bootstrap,
        group_id=f"g-{uuid.uuid4().hex[:6]}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    record = await consumer.getone()
    yield kafka_bootstrap, topic_out, consumer, record
    await consumer.stop()


async def test_the_output_and_the_consumed_offset_commit_together(source):
    bootstrap, topic_out, consumer, record = source
    outlet = TransactionalOutlet(bootstrap, topic_out, consumer._group_id, f"txn-{uuid.uuid4().hex[:8]}")
    await outlet.start()
    try:
        outlet.stage(REPLY, b"c", record)
        assert await read_all(bootstrap, topic_out, "read_committed") == [b"warm-up"]  # staged: nothing visible yet
        await outlet.commit({TopicPartition(record.topic, record.partition): record.offset + 1})
    finally:
        await outlet.stop()
    assert await committed_offset(consumer, record) == record.offset + 1
    values = await read_all(bootstrap, topic_out, "read_committed")
    assert values[1:] == [REPLY.model_dump_json().encode()]


async def test_a_reply_waits_for_the_commit_that_covers_its_input(source):
    """With concurrent handlers, a finished record beyond an unfinished one must not be replied yet:
    the committed offset would not cover it, and a restart would reply to it again."""
    bootstrap, topic_out, consumer, record = source
    tp = TopicPartition(record.topic, record.partition)
    outlet = TransactionalOutlet(bootstrap, topic_out, consumer._group_id, f"txn-{uuid.uuid4().hex[:8]}")
    await outlet.start()
    try:
        outlet.stage(REPLY, b"c", record)
        await outlet.commit({tp: record.offset})  # an earlier record is still running: offset stays below ours
        assert await read_all(bootstrap, topic_out, "read_committed") == [b"warm-up"]
        assert outlet.staged == 1
        outlet.stage(REPLY, b"c", record)  # read again (say, after a rebalance): replaces, never doubles
        await outlet.commit({tp: record.offset + 1})
        assert outlet.staged == 0
    finally:
        await outlet.stop()
    assert (await read_all(bootstrap, topic_out, "read_committed")).count(REPLY.model_dump_json().encode()) == 1


async def test_an_aborted_attempt_is_invisible_to_read_committed_readers_and_commits_nothing(source):
    bootstrap, topic_out, consumer, record = source
    outlet = TransactionalOutlet(bootstrap, topic_out, consumer._group_id, f"txn-{uuid.uuid4().hex[:8]}")
    await outlet.start()
    try:
        with pytest.raises(RuntimeError):
            async with outlet._producer.transaction():
                await outlet._producer.send(topic_out, b"half-done reply", key=b"c")
                raise RuntimeError("crash before the offset commit")
        outlet.stage(REPLY, b"c", record)  # the redelivered attempt
        await outlet.commit({TopicPartition(record.topic, record.partition): record.offset + 1})
    finally:
        await outlet.stop()
    committed = await read_all(bootstrap, topic_out, "read_committed")
    assert b"half-done reply" not in committed
    assert committed.count(REPLY.model_dump_json().encode()) == 1
    assert b"half-done reply" in await read_all(bootstrap, topic_out, "read_uncommitted")


@pytest.fixture
async def outlet(source):
    """A started outlet on the source's group, and the consumed record's partition; stopped at the end."""
    bootstrap, topic_out, consumer, record = source
    outlet = TransactionalOutlet(bootstrap, topic_out, consumer._group_id, f"txn-{uuid.uuid4().hex[:8]}")
    await outlet.start()
    yield outlet, TopicPartition(record.topic, record.partition)
    await outlet.stop()


async def test_a_producer_broken_for_good_is_replaced_and_the_reply_committed_once(source, outlet):
    """aiokafka puts a transactional producer in its fatal state for good when a connection drops while it looks
    up a coordinator (a broker of a cluster SIGKILLed): the gateway's replies stopped for good. The outlet
    now discards a producer whose commit failed; the next commit registers a fresh one and publishes."""
    bootstrap, topic_out, consumer, record = source
    outlet, tp = outlet
    outlet.stage(REPLY, b"c", record)
    await outlet._producer.begin_transaction()  # the state the sender routine's death left it in, mid-transaction
    outlet._producer._txn_manager.fatal_error(KafkaError("what a lost coordinator connection leaves"))
    with pytest.raises(AssertionError, match="FATAL_ERROR"):  # aiokafka's words for it
        await outlet.commit({tp: record.offset + 1})
    assert outlet.staged == 1
    await outlet.commit({tp: record.offset + 1})  # what the consumer's commit loop does a second later
    assert outlet.staged == 0
    assert await committed_offset(consumer, record) == record.offset + 1
    assert (await read_all(bootstrap, topic_out, "read_committed")).count(REPLY.model_dump_json().encode()) == 1


async def test_a_commit_whose_answer_was_lost_is_not_published_again(source, outlet):
    """A failed commit may have committed (its answer lost with a broker). The fresh producer settles it, and
    the group's committed offsets then show the staged reply was published: it is dropped, not sent twice."""
    bootstrap, topic_out, consumer, record = source
    outlet, tp = outlet
    outlet.stage(REPLY, b"c", record)
    async with outlet._producer.transaction():  # the transaction commits, but the outlet never hears so
        await outlet._producer.send(topic_out, REPLY.model_dump_json().encode(), key=b"c")
        await outlet._producer.send_offsets_to_transaction({tp: record.offset + 1}, consumer._group_id)
    await outlet._discard()
    await outlet.commit({tp: record.offset + 1})
    assert outlet.staged == 0
    assert (await read_all(bootstrap, topic_out, "read_committed")).count(REPLY.model_dump_json().encode()) == 1
