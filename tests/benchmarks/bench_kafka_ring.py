"""The floor under the fleet's overhead per loop iteration: a raw aiokafka ring of four hops.

    .venv/bin/python -m tests.benchmarks.bench_kafka_ring        (~1 minute; starts its own broker)

One loop iteration of the fleet is four Kafka hops (iteration -> guard -> tool call check ->
gate -> batch -> executor -> model call -> model). This passes one small message around a ring
of four topics with nothing but aiokafka on the same embedded broker: each hop is a publish
(idempotent producer, acks=all, linger 0, as the services' producer) and a consumer that reads
it and publishes the next hop. It prints the p50/p99 time of one lap (four hops), with the
offsets committed per message (`--commit each`) or not at all on the path (`--commit none`,
as the key-ordered consumer does: it commits in the background, batched). Whatever the fleet
adds beyond this at one concurrent turn is its own work (handlers, ledger, spans, decoding).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from services.broker.embedded import EmbeddedKafka, fetch_kafka, free_port
from services.kernel.settings import get_settings
from tests.benchmarks.profiling import percentile

HOPS = 4


async def ring(bootstrap: str, laps: int, commit_each: bool) -> list[float]:
    names = [f"ring-{uuid.uuid4().hex[:6]}-{i}" for i in range(HOPS)]
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic(n, num_partitions=1, replication_factor=1) for n in names])
    await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, linger_ms=0)
    await producer.start()
    consumers = [AIOKafkaConsumer(n, bootstrap_servers=bootstrap, group_id=f"g-{n}", auto_offset_reset="earliest",
                                  enable_auto_commit=False, fetch_max_wait_ms=5000) for n in names]
    for c in consumers:
        await c.start()
    lap_done: asyncio.Queue[float] = asyncio.Queue()

    async def relay(i: int) -> None:
        consumer, target = consumers[i], names[(i + 1) % HOPS]
        while True:
            record = await consumer.getone()
            if commit_each:
                await consumer.commit()
            if i == HOPS - 1:
                await lap_done.put(time.perf_counter())
            else:
                await (await producer.send(target, record.value, key=record.key))

    tasks = [asyncio.create_task(relay(i)) for i in range(HOPS)]
    try:
        await asyncio.sleep(3)  # the groups join
        laps_ms = []
        for n in range(laps + 20):
            started = time.perf_counter()
            await (await producer.send(names[0], b'{"step": 1}', key=b"conv_1"))
            ended = await asyncio.wait_for(lap_done.get(), 30)
            if n >= 20:  # warm-up laps
                laps_ms.append((ended - started) * 1000)
        return laps_ms
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for c in consumers:
            await c.stop()
        await producer.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.bench_kafka_ring", description=__doc__.split("\n\n")[0])
    parser.add_argument("--laps", type=int, default=300)
    parser.add_argument("--commit", choices=("none", "each", "both"), default="both")
    args = parser.parse_args(argv)
    version = get_settings().kafka_version
    fetch_kafka(version)
    with tempfile.TemporaryDirectory(prefix="roundtrip-ring-") as state:
        broker = EmbeddedKafka(Path(state) / "kafka", free_port(), free_port(), version, die_with_parent=True)
        broker.start()
        try:
            broker.wait_ready(90)
            modes = ["none", "each"] if args.commit == "both" else [args.commit]
            for mode in modes:
                laps = asyncio.run(ring(broker.bootstrap, args.laps, mode == "each"))
                print(f"raw aiokafka ring, {HOPS} hops, commit {mode:>4}: lap p50 {statistics.median(laps):.1f} ms, "
                      f"p99 {percentile(laps, 0.99):.1f} ms ({statistics.median(laps) / HOPS:.2f} ms a hop; {len(laps)} laps)",
                      flush=True)
        finally:
            broker.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
