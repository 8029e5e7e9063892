"""The floor under the fleet's overhead per loop iteration: a raw aiokafka ring of four hops.

    .venv/bin/python -m tests.benchmarks.bench_kafka_ring        (~4 minutes; starts its own broker)

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

`--cpu-rates` then measures the CPU of a hop at a steady rate, records evenly spaced so that each
travels alone (records per second into the ring, spread over 50 keys and 6 partitions; the last
relay only reads): the CPU of the relays and of the publisher that feeds the ring, and the
broker's, per hop. 330 records/s make ~1300 hops/s, the fleet's rate at 50 concurrent turns with
no model latency; 105 make ~420, its rate at 100 turns with 1 s. `--clients` compares aiokafka with librdkafka
(confluent-kafka, from the '.[bench]' extra): `confluent` is librdkafka under asyncio as a service
would run it (its consumer polled in a thread, records and deliveries handed to the event loop),
`confluent-sync` a plain blocking loop (librdkafka's own floor).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from roundtrip._broker.embedded import EmbeddedKafka, fetch_configured, free_port
from roundtrip._kernel.settings import Settings
from tests.benchmarks.profiling import CpuMeter, percentile

HOPS = 4
GAP_S = 0.01  # between laps, as between a turn's iterations: each lap starts from an idle ring
HOPS_PER_TURN = 14  # of the fleet's turn of three model calls (docs/benchmarks.md)
KEYS = 50
BODY = b'{"step": 1, "transcript": "' + b"x" * 1500 + b'"}'  # about a model call's size


async def _topics(bootstrap: str, partitions: int = 1) -> list[str]:
    names = [f"ring-{uuid.uuid4().hex[:6]}-{i}" for i in range(HOPS)]
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic(n, num_partitions=partitions, replication_factor=1) for n in names])
    await admin.close()
    return names


async def _relay(
    bootstrap: str,
    source: str,
    target: str,
    commit_each: bool,
    producer: AIOKafkaProducer | None = None,
    arrived: asyncio.Queue | None = None,
) -> None:
    """Read `source`, publish each record to `target` (or report its arrival, for the ring's last hop)."""
    own = producer is None
    if own:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, linger_ms=0)
        await producer.start()
    consumer = AIOKafkaConsumer(
        source,
        bootstrap_servers=bootstrap,
        group_id=f"g-{source}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        fetch_max_wait_ms=5000,
    )
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
        children = [
            context.Process(target=_relay_process, args=(bootstrap, names[i], names[i + 1]), daemon=True)
            for i in range(HOPS - 1)
        ]
        for child in children:
            child.start()
        tasks = [asyncio.create_task(_relay(bootstrap, names[-1], "", False, producer, lap_done))]
    else:
        tasks = [
            asyncio.create_task(
                _relay(
                    bootstrap,
                    names[i],
                    names[(i + 1) % HOPS],
                    commit_each,
                    producer,
                    lap_done if i == HOPS - 1 else None,
                )
            )
            for i in range(HOPS)
        ]
    try:
        await asyncio.sleep(8 if processes else 3)  # the groups join
        laps_ms = []
        for n in range(warmup + laps):
            started = time.perf_counter()
            await (await producer.send(names[0], b'{"step": 1}', key=b"conv_1"))
            ended = await asyncio.wait_for(lap_done.get(), 30)
            if n >= warmup:
                laps_ms.append((ended - started) * 1000)
            await asyncio.sleep(GAP_S)  # the gap between laps: one record round the ring at a time
        return laps_ms
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for child in children:
            child.kill()
        await producer.stop()


# -- CPU per hop at a steady rate ------------------------------------------------------------------


def _aiokafka_rate_relay(bootstrap: str, source: str, target: str, count) -> None:
    """Read `source` and publish each record to `target` concurrently, awaiting each delivery as the
    services do before a message counts as done; offsets committed in the background (the kernel
    commits batched too). No target: only read."""

    async def run() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, linger_ms=0)
        await producer.start()
        consumer = AIOKafkaConsumer(
            source,
            bootstrap_servers=bootstrap,
            group_id=f"g-{source}",
            auto_offset_reset="earliest",
            enable_auto_commit=True,
            auto_commit_interval_ms=500,
            fetch_max_wait_ms=5000,
        )
        await consumer.start()
        running: set[asyncio.Task] = set()

        async def forward(record) -> None:
            if target:
                await (await producer.send(target, record.value, key=record.key))
            count.value += 1

        while True:
            for records in (await consumer.getmany(timeout_ms=5000)).values():
                for record in records:
                    task = asyncio.create_task(forward(record))
                    running.add(task)
                    task.add_done_callback(running.discard)

    asyncio.run(run())


def _confluent_configs(bootstrap: str, source: str) -> tuple[dict, dict]:
    producer = {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 0}
    consumer = {
        "bootstrap.servers": bootstrap,
        "group.id": f"g-{source}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": True,
        "auto.commit.interval.ms": 500,
        "fetch.wait.max.ms": 5000,
        "fetch.queue.backoff.ms": 0,
    }
    return producer, consumer


def _poll_batch(consumer, timeout: float) -> list:
    """What is there, up to 500 records, waiting at most `timeout` for the first (consume() waits for all 500)."""
    first = consumer.poll(timeout)
    if first is None:
        return []
    return [m for m in [first, *consumer.consume(num_messages=500, timeout=0)] if not m.error()]


def _confluent_sync_rate_relay(bootstrap: str, source: str, target: str, count) -> None:
    from confluent_kafka import Consumer, Producer

    producer_config, consumer_config = _confluent_configs(bootstrap, source)
    producer, consumer = Producer(producer_config), Consumer(consumer_config)
    consumer.subscribe([source])

    def delivered(err, msg) -> None:
        count.value += 1

    while True:
        for message in _poll_batch(consumer, 0.05):
            if target:
                producer.produce(target, message.value(), key=message.key(), on_delivery=delivered)
            else:
                count.value += 1
        producer.poll(0)


def _confluent_rate_relay(bootstrap: str, source: str, target: str, count) -> None:
    from confluent_kafka import Consumer, Producer

    async def run() -> None:
        loop = asyncio.get_running_loop()
        producer_config, consumer_config = _confluent_configs(bootstrap, source)
        producer, consumer = Producer(producer_config), Consumer(consumer_config)
        consumer.subscribe([source])
        inbox: asyncio.Queue[list] = asyncio.Queue()

        def poll_records() -> None:
            while True:
                if batch := _poll_batch(consumer, 1.0):
                    loop.call_soon_threadsafe(inbox.put_nowait, batch)

        def poll_deliveries() -> None:
            while True:
                producer.poll(1.0)

        threading.Thread(target=poll_records, daemon=True).start()
        threading.Thread(target=poll_deliveries, daemon=True).start()

        def settle(done: asyncio.Future, err) -> None:
            if not done.done():
                done.set_result(err)

        async def forward(message) -> None:
            if target:
                done = loop.create_future()
                producer.produce(
                    target,
                    message.value(),
                    key=message.key(),
                    on_delivery=lambda err, _msg: loop.call_soon_threadsafe(settle, done, err),
                )
                await done
            count.value += 1

        running: set[asyncio.Task] = set()
        while True:
            for message in await inbox.get():
                task = asyncio.create_task(forward(message))
                running.add(task)
                task.add_done_callback(running.discard)

    asyncio.run(run())


RATE_RELAYS = {
    "aiokafka": _aiokafka_rate_relay,
    "confluent": _confluent_rate_relay,
    "confluent-sync": _confluent_sync_rate_relay,
}


async def _feed(bootstrap: str, topic: str, rate: float, seconds: float) -> None:
    """Publish `rate` records a second for `seconds`, over KEYS keys, one at a time."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, linger_ms=0)
    await producer.start()
    try:
        started, n = time.perf_counter(), 0
        while (now := time.perf_counter()) - started < seconds:
            if (delay := started + n / rate - now) > 0:
                await asyncio.sleep(delay)  # pacing: the next record is due at the offered rate
            await (await producer.send(topic, BODY, key=f"conv_{n % KEYS}".encode()))
            n += 1
    finally:
        await producer.stop()


def cpu_per_hop(bootstrap: str, broker_pid: int, client: str, rate: float, seconds: float) -> dict[str, float]:
    """CPU per hop (µs) of the relays plus the feeding publisher, and of the broker, at `rate`
    records a second into a ring of processes (one per topic, 6 partitions each)."""
    names = asyncio.run(_topics(bootstrap, partitions=6))
    context = multiprocessing.get_context("spawn")
    counts = [context.Value("q", 0, lock=False) for _ in range(HOPS)]
    relays = [
        context.Process(
            target=RATE_RELAYS[client],
            daemon=True,
            args=(bootstrap, names[i], names[i + 1] if i + 1 < HOPS else "", counts[i]),
        )
        for i in range(HOPS)
    ]
    for relay in relays:
        relay.start()
    try:
        time.sleep(8)  # the groups join
        asyncio.run(_feed(bootstrap, names[0], rate, 5))  # connections, assignments
        meter = CpuMeter(
            {"broker": broker_pid, "feeder": os.getpid(), **{f"relay {i}": r.pid for i, r in enumerate(relays)}}
        )
        hops0, started = sum(c.value for c in counts), time.perf_counter()
        meter.start()
        asyncio.run(_feed(bootstrap, names[0], rate, seconds))
        time.sleep(0.5)  # the last records go round
        cpu = meter.stop()
        elapsed = time.perf_counter() - started
        hops = sum(c.value for c in counts) - hops0
        broker_cpu = cpu.pop("broker")
        clients_cpu = sum(cpu.values())  # the relays and the feeding publisher (this process)
    finally:
        for relay in relays:
            relay.kill()
    return {"hops_per_s": hops / elapsed, "clients_us": clients_cpu / hops * 1e6, "broker_us": broker_cpu / hops * 1e6}


def _clients(requested: str) -> list[str]:
    if requested != "auto":
        return requested.split(",")
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        print("(confluent-kafka is not installed: only aiokafka; pip install -e '.[bench]' adds it)", flush=True)
        return ["aiokafka"]
    return list(RATE_RELAYS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.bench_kafka_ring", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--laps", type=int, default=500)
    parser.add_argument(
        "--warmup", type=int, default=3000, help="laps before the first measured one (the broker's JIT)"
    )
    parser.add_argument("--commit", choices=("none", "each", "both"), default="both")
    parser.add_argument("--no-processes", dest="processes", action="store_false", help="skip the ring of processes")
    parser.add_argument(
        "--cpu-rates",
        default="330,105",
        help="records/s into the ring for the CPU per hop (comma-separated; 0 skips; default 330,105: "
        "the fleet's hop rates at c=50 with no model latency and at c=100 with 1 s)",
    )
    parser.add_argument("--cpu-seconds", type=float, default=15, help="seconds measured at each rate")
    parser.add_argument(
        "--clients",
        default="auto",
        help="comma-separated of aiokafka, confluent, confluent-sync (default: all that are installed)",
    )
    args = parser.parse_args(argv)
    try:
        rates = [rate for rate in (float(r) for r in args.cpu_rates.split(",")) if rate > 0]
    except ValueError:
        parser.error(f"--cpu-rates: comma-separated numbers, not {args.cpu_rates!r}")
    clients = _clients(args.clients) if rates else []
    unknown = sorted(set(clients) - set(RATE_RELAYS))
    if unknown:
        parser.error(f"unknown client(s) {', '.join(unknown)}: choose from {', '.join(RATE_RELAYS)}")
    defaults = Settings()
    libs = fetch_configured(defaults)
    with tempfile.TemporaryDirectory(prefix="roundtrip-ring-") as state:
        broker = EmbeddedKafka(
            Path(state) / "kafka", free_port(), free_port(), defaults.kafka_version, libs_dir=libs, die_with_parent=True
        )
        broker.start()
        try:
            broker.wait_ready(90)
            modes = [
                ("one process", m == "each", m) for m in (["none", "each"] if args.commit == "both" else [args.commit])
            ]
            if args.processes:
                modes.append(("a process per relay", False, "none"))
            warmup = args.warmup
            for label, commit_each, commit in modes:
                laps = asyncio.run(
                    ring(broker.bootstrap, args.laps, commit_each, warmup, processes=label != "one process")
                )
                warmup = min(warmup, 300)  # the broker is warm after the first ring
                print(
                    f"raw aiokafka ring, {HOPS} hops, {label}, commit {commit:>4}: lap p50 "
                    f"{statistics.median(laps):.1f} ms, "
                    f"p99 {percentile(laps, 0.99):.1f} ms ({statistics.median(laps) / HOPS:.2f} ms a hop; {len(laps)} "
                    "laps)",
                    flush=True,
                )
            for rate in rates:
                for client in clients:
                    cpu = cpu_per_hop(broker.bootstrap, broker.pid, client, rate, args.cpu_seconds)
                    total = cpu["clients_us"] + cpu["broker_us"]
                    print(
                        f"CPU per hop at {rate:.0f} records/s into the ring ({cpu['hops_per_s']:.0f} hops/s), "
                        f"{client:>14}: "
                        f"clients {cpu['clients_us']:.0f} us + broker {cpu['broker_us']:.0f} us = {total:.0f} us; "
                        f"a turn's {HOPS_PER_TURN} hops {total * HOPS_PER_TURN / 1000:.1f} ms",
                        flush=True,
                    )
        finally:
            broker.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
