"""A process that consumes a topic with the kernel's KeyOrderedConsumer, for tests that kill it.

    python -m tests.integration.consumer_worker BOOTSTRAP TOPIC GROUP OUT_FILE [--block-value V]

Each processed record is appended to OUT_FILE as "key value offset" (one line, flushed) after
a short random sleep; a record whose value is --block-value never finishes (it waits forever),
as a handler stuck on a slow model call would. "ready" is printed once partitions are assigned.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random

from aiokafka import AIOKafkaConsumer

from tests.consumers import key_ordered


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("bootstrap")
    p.add_argument("topic")
    p.add_argument("group")
    p.add_argument("out")
    p.add_argument("--block-value", default=None)
    p.add_argument("--max-in-flight", type=int, default=100)
    args = p.parse_args()
    fd = os.open(args.out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    async def process(record) -> None:
        if args.block_value is not None and record.value.decode() == args.block_value:
            await asyncio.Event().wait()
        await asyncio.sleep(random.uniform(0, 0.01))  # a random processing time: the records finish out of order
        os.write(fd, f"{record.key.decode()} {record.value.decode()} {record.offset}\n".encode())

    koc = key_ordered(process, name="worker", max_in_flight=args.max_in_flight, commit_interval_s=0.05)
    consumer = AIOKafkaConsumer(
        args.topic,
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=500,
    )
    consumer.subscribe([args.topic], listener=koc)
    await consumer.start()
    task = asyncio.create_task(koc.run(consumer))
    while not koc.assigned:
        await asyncio.sleep(0.05)  # poll interval: the worker's partitions assigned
    print("ready", flush=True)
    await task


if __name__ == "__main__":
    asyncio.run(main())
