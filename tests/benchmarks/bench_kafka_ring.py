"""The floor under the fleet's overhead per loop iteration: a raw aiokafka ring of four hops.

    .venv/bin/python -m tests.benchmarks.bench_kafka_ring        (~1 minute; starts its own broker)

One loop iteration of the fleet is four Kafka hops (iteration -> guard -> tool call check ->
gate -> batch -> executor -> model call -> model). This passes one small message around a ring
of four topics with nothing but aiokafka on the same embedded broker: each hop is a publish
(idempotent producer, acks=all, linger 0, as the services' producer) and a consumer that reads
it and publishes the next hop. It prints the p50/p99 time of one lap (four hops):

* with every relay in this one process, and with the offsets committed per message
  (`--commit each`) or not at all on the path (`--commit none`, as the key-ordered consumer does:
  it commits in the background, batched);
* with every relay in a process of its own, as the fleet's services are (`--processes`, on by
  default): each hop then also wakes another process, which is what the fleet pays per hop.

The broker is warmed up first (`--warmup` laps): its JIT compiles the request path over its first
~20,000 records, and a cold broker adds ~1 ms a hop. Whatever the fleet adds beyond the ring of
processes at one concurrent turn is its own work (handlers, ledger, spans, decoding).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
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
GAP_S = 0.01  # between laps, as between a turn's iterations: each lap starts from an idle ring


async def _topics(bootstrap: str) -> list[str]:
    names = [f"ring-{uuid.uuid4().hex[:6]}-{i}" for i in range(HOPS)]
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic(n, num_partitions=1, replication_factor=1) for n in names])
    await admin.close()
    return names


async def _relay(bootstrap: str, source: str, target: str, commit_each: bool, producer: AIOKafkaProducer | None = None,
                 arrived: asyncio.Queue | None = None) -> None:
    """Read `source`, publish each record to `target` (or report its arrival, for the ring's last hop)."""
    own = producer is None
    if own:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, linger_ms=0)
        await producer.start()
    consumer = AIOKafkaConsumer(source, bootstrap_servers=bootstrap, group_id=f"g-{source}", auto_offset_reset="earliest",
                                enable_auto_commit=False, fetch_max_wait_ms=5000)
    await consumer.start()
    try:
        while True:
            record = await consumer.getone()
            if commit_each:
                await consumer.commit()
            if arrived is not None:
                await arrived.put(time.perf_counter())
            else:
                await (await producer.send(target, record.value, key=record.key))
    finally:
        await consumer.stop()
        if own:
            await producer.stop()


def _relay_process(bootstrap: str, source: str, target: str) -> None:
    asyncio.run(_relay(bootstrap, source, target, commit_each=False))


async def ring(bootstrap: str, laps: int, commit_each: bool, warmup: int = 0, processes: bool = False) -> list[float]:
    """Lap times (ms) of one record around the four topics; relays in this process or each in its own."""
    names = await _topics(bootstrap)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, linger_ms=0)
    await producer.start()
    lap_done: asyncio.Queue[float] = asyncio.Queue()
    children: list[multiprocessing.Process] = []
    if processes:  # hops 0..2 in processes of their own; the last hop comes back to this one
        context = multiprocessing.get_context("spawn")
        children = [context.Process(target=_relay_process, args=(bootstrap, names[i], names[i + 1]), daemon=True)
                    for i in range(HOPS - 1)]
        for child in children:
            child.start()
        tasks = [asyncio.create_task(_relay(bootstrap, names[-1], "", False, producer, lap_done))]
    else:
        tasks = [asyncio.create_task(_relay(bootstrap, names[i], names[(i + 1) % HOPS], commit_each, producer,
                                            lap_done if i == HOPS - 1 else None)) for i in range(HOPS)]
    try:
        await asyncio.sleep(8 if processes else 3)  # the groups join
        laps_ms = []
        for n in range(warmup + laps):
            started = time.perf_counter()
            await (await producer.send(names[0], b'{"step": 1}', key=b"conv_1"))
            ended = await asyncio.wait_for(lap_done.get(), 30)
            if n >= warmup:
                laps_ms.append((ended - started) * 1000)
            await asyncio.sleep(GAP_S)
        return laps_ms
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for child in children:
            child.kill()
        await producer.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.bench_kafka_ring", description=__doc__.split("\n\n")[0])
    parser.add_argument("--laps", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=3000, help="laps before the first measured one (the broker's JIT)")
    parser.add_argument("--commit", choices=("none", "each", "both"), default="both")
    parser.add_argument("--no-processes", dest="processes", action="store_false", help="skip the ring of processes")
    args = parser.parse_args(argv)
    version = get_settings().kafka_version
    fetch_kafka(version)
    with tempfile.TemporaryDirectory(prefix="roundtrip-ring-") as state:
        broker = EmbeddedKafka(Path(state) / "kafka", free_port(), free_port(), version, die_with_parent=True)
        broker.start()
        try:
            broker.wait_ready(90)
            modes = [("one process", m == "each", m) for m in (["none", "each"] if args.commit == "both" else [args.commit])]
            if args.processes:
                modes.append(("a process per relay", False, "none"))
            warmup = args.warmup
            for label, commit_each, commit in modes:
                laps = asyncio.run(ring(broker.bootstrap, args.laps, commit_each, warmup, processes=label != "one process"))
                warmup = min(warmup, 300)  # the broker is warm after the first ring
                print(f"raw aiokafka ring, {HOPS} hops, {label}, commit {commit:>4}: lap p50 {statistics.median(laps):.1f} ms, "
                      f"p99 {percentile(laps, 0.99):.1f} ms ({statistics.median(laps) / HOPS:.2f} ms a hop; {len(laps)} laps)",
                      flush=True)
        finally:
            broker.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
