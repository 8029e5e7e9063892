"""History caching: billed input tokens of a 5-request conversation with and without it.

Usage: .venv/bin/python -m tests.benchmarks.bench_conversation   (about a minute; not pass/fail)

It starts the fleet (embedded Kafka, simulator, shop, the five services) on free ports in a
temporary folder, and holds the same 5-request conversation twice as a client app would
(support.requests -> support.replies, careful persona, Alice): first with the model service's
`ROUNDTRIP_CACHE_HISTORY=false` (only tools and system prompt are cached; the history is sent
as plain input on every model call), then with it on (moving breakpoints on the last message
and the previous request's last message). The shop is reset before each run and each run's
texts carry a run tag; the simulator is restarted before each run (an empty prompt cache), so
each run pays its own cache writes and cannot read what the other one cached. Every figure
comes from the usage the simulator billed (services/_simulator/usage.py, the API's rules).

"Billed input" weighs each kind of input token by its price relative to plain input:
input x 1 + cache writes x 1.25 + cache reads x 0.1 (the 5-minute cache's multipliers).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import uuid
from pathlib import Path

import httpx
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from roundtrip._fleet.launcher import Fleet
from roundtrip._kernel.kafka.aiokafka_seam import partitions_of
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.storage.prices import PriceTable
from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import SupportReply, Usage
from tests.benchmarks.bench_loop import bench_settings
from tests.processes import restart

TEXTS = (
    "what orders do I have?",
    "cancel the second one you listed",
    "where is my order?",
    "how do refunds work?",
    "what orders do I have now?",
)
CUSTOMER = "cus_1001"


def billed(u: Usage) -> float:
    return u.input_tokens + 1.25 * u.cache_creation_input_tokens + 0.1 * u.cache_read_input_tokens


async def conversation(settings: Settings, tag: str) -> list[SupportReply]:
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.bootstrap_servers, enable_auto_commit=False, isolation_level="read_committed"
    )
    await producer.start()
    await consumer.start()
    try:
        parts = await partitions_of(consumer, [topics.t(topics.SUPPORT_REPLIES, settings.topic_prefix)])
        consumer.assign(parts)
        await consumer.seek_to_end(*parts)
        for tp in parts:
            await consumer.position(tp)
        conversation_id = f"conv_bench_{tag}_{uuid.uuid4().hex[:6]}"
        replies = []
        for n, text in enumerate(TEXTS):
            request_id = f"req_{tag}_{n}_{uuid.uuid4().hex[:6]}"
            body = {
                "request_id": request_id,
                "conversation_id": conversation_id,
                "customer_id": CUSTOMER,
                "text": f"{text} [{tag}]",
                "persona": "careful",
            }
            await producer.send_and_wait(
                topics.t(topics.SUPPORT_REQUESTS, settings.topic_prefix),
                json.dumps(body).encode(),
                key=conversation_id.encode(),
            )
            deadline = time.monotonic() + 120
            reply = None
            while reply is None and time.monotonic() < deadline:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    for record in records:
                        data = json.loads(record.value)
                        if data.get("request_id") == request_id:
                            reply = SupportReply.model_validate(data)
            if reply is None:
                raise RuntimeError(f"no reply to {text!r}")
            replies.append(reply)
        return replies
    finally:
        await consumer.stop()
        await producer.stop()


def table(name: str, replies: list[SupportReply]) -> str:
    lines = [
        f"{name}",
        f"  {'request':<34} {'steps':>5} {'input':>7} {'cache write':>11} {'cache read':>10} {'billed input':>12}",
    ]
    for text, r in zip(TEXTS, replies, strict=True):
        u = r.usage
        lines.append(
            f"  {text:<34} {r.steps:>5} {u.input_tokens:>7,} {u.cache_creation_input_tokens:>11,} "
            f"{u.cache_read_input_tokens:>10,} {billed(u):>12,.0f}"
        )
    total = sum((r.usage for r in replies), Usage())
    lines.append(
        f"  {'total':<34} {sum(r.steps for r in replies):>5} {total.input_tokens:>7,} "
        f"{total.cache_creation_input_tokens:>11,} "
        f"{total.cache_read_input_tokens:>10,} {billed(total):>12,.0f}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.bench_conversation", description=__doc__.split("\n\n")[0]
    )
    parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="roundtrip-bench-conv-") as folder:
        settings, env = bench_settings(Path(folder), partitions=2)
        fleet = Fleet(settings, env=env, say=print)
        prices = PriceTable.from_json(settings.prices, settings.model_provider)
        try:
            fleet.start()
            runs = {}
            for name, on in (("without history caching", False), ("with history caching", True)):
                restart(
                    fleet, "simulator"
                )  # an empty prompt cache: each run pays its own writes of tools and system prompt
                restart(fleet, "model", {**env, "ROUNDTRIP_CACHE_HISTORY": str(on).lower()})
                httpx.post(f"{settings.shop_base_url}/admin/reset", timeout=10).raise_for_status()
                runs[name] = asyncio.run(conversation(settings, "on" if on else "off"))
        finally:
            fleet.stop()
    print()
    for name, replies in runs.items():
        print(table(name, replies))
        print()
    off, on = (sum((r.usage for r in runs[n]), Usage()) for n in runs)
    cost_off, cost_on = prices.cost(settings.model, off), prices.cost(settings.model, on)
    print(
        f"billed input tokens: {billed(off):,.0f} without, {billed(on):,.0f} with history caching: "
        f"{1 - billed(on) / billed(off):.0%} fewer"
    )
    print(f"uncached input tokens: {off.input_tokens:,} without, {on.input_tokens:,} with")
    print(
        f"cost of the conversation (input and output, {settings.model}): ${cost_off:.4f} without, ${cost_on:.4f} with "
        f"({1 - cost_on / cost_off:.0%} less)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
