"""The faults the faulted soak rotates (tests/benchmarks/bench_faulted.py), each a real one on a running fleet.

Each is an async function of the `Rig` (the fleet with the chaos suite's fault helpers, tests/chaos/conftest.py, its
PostgreSQL server, the observer) that returns when the fault is over and the fleet is whole again: the harness's
`Fault`s it made, each with its span (for the audit, a call run again near one is that fault's doing).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx

from tests.chaos.conftest import ChaosFleet
from tests.chaos.harness import Fault, Observer
from tests.databases import PostgresServer

SERVICES_IN_TURN = ("gateway", "model", "guard", "gate", "executor")
BROKER_DOWN_S = 3.0  # the broker SIGKILLed stays down this long, turns in flight
POSTGRES_DOWN_S = 5.0
BROKER_STOPPED_S = 30.0
SHOP_AWAY_S = 60.0
OVERLOAD_S = 60.0


@dataclass
class Rig:
    fleet: ChaosFleet
    database: PostgresServer
    observer: Observer
    simulator_url: str


async def broker_kill(rig: Rig) -> list[Fault]:
    at = time.time()
    await rig.fleet.kill_broker()
    await asyncio.sleep(BROKER_DOWN_S)  # down while turns are in flight
    await rig.fleet.start_broker()
    return [Fault("the broker SIGKILLed", at, time.time())]


async def postgres_kill(rig: Rig) -> list[Fault]:
    at = time.time()
    await asyncio.to_thread(rig.database.halt, signal.SIGKILL)  # postmaster and backends: crash recovery follows
    await asyncio.sleep(POSTGRES_DOWN_S)  # down while turns are in flight
    await asyncio.to_thread(rig.database.resume)
    return [Fault("PostgreSQL SIGKILLed", at, time.time())]


async def broker_stop(rig: Rig) -> list[Fault]:
    """SIGSTOP of the broker's JVM (its process group) for 30 s: connections stay open, nothing answers."""
    proc = rig.fleet.kafka.proc
    assert proc is not None and proc.poll() is None
    at = time.time()
    os.killpg(proc.pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(BROKER_STOPPED_S)  # the stop the fault is named for
    finally:
        os.killpg(proc.pid, signal.SIGCONT)
    return [Fault("the broker SIGSTOPped 30 s", at, time.time())]


async def services_kill(rig: Rig) -> list[Fault]:
    """Each service SIGKILLed in turn and started again; the executors right after a signed batch with a side
    effect was published, so a batch is being run when they die."""
    made = []
    for name in SERVICES_IN_TURN:
        if name == "executor":
            await _a_side_effecting_batch_published(rig.observer)
        at = time.time()
        await rig.fleet.kill_and_respawn(name)
        made.append(Fault(f"the {name} SIGKILLed", at, time.time()))
    return made


async def _a_side_effecting_batch_published(observer: Observer, timeout: float = 30) -> None:
    seen = len(observer.seen.batches)
    await observer.wait_for(
        lambda: any(
            name in ("cancel_order", "escalate") for b in observer.seen.batches[seen:] for name, _ in b["calls"]
        ),
        timeout,
        "a signed batch with a side effect",
    )


async def shop_away(rig: Rig) -> list[Fault]:
    """The demo agent's backend SIGKILLed, started again 60 s later: every shop call refused meanwhile."""
    at = time.time()
    await asyncio.to_thread(rig.fleet.sync.kill, "shop")
    await asyncio.sleep(SHOP_AWAY_S)  # the outage the fault is named for
    await asyncio.to_thread(rig.fleet.sync.respawn, "shop")
    return [Fault("the shop away 60 s", at, time.time())]


async def overload(rig: Rig) -> list[Fault]:
    """The Messages API answering 529 to every call for 60 s (the simulator's /v1/_overload control)."""
    async with httpx.AsyncClient(timeout=10) as http:
        at = time.time()
        answer = await http.post(f"{rig.simulator_url}/v1/_overload", json={"seconds": OVERLOAD_S, "status": 529})
        answer.raise_for_status()
    await asyncio.sleep(OVERLOAD_S)  # the burst runs in the simulator; it ends by itself
    return [Fault("the Messages API answering 529 for 60 s", at, time.time())]


FAULTS: dict[str, Callable[[Rig], Awaitable[list[Fault]]]] = {
    "broker-kill": broker_kill,
    "postgres-kill": postgres_kill,
    "broker-stop": broker_stop,
    "services-kill": services_kill,
    "shop-away": shop_away,
    "overload": overload,
}
