"""Benchmark of the gate (not a test): validation and authorization throughput, added latency per step.

    .venv/bin/python -m tests.benchmarks.bench_gate [--seconds 2] [--steps 300]

Runs the real shop with uvicorn in a subprocess on a free port (SQLite in a temp folder) and
talks to it over HTTP, as the gate service does. Prints a table; docs/gate.md has the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from httpx_aiohttp import AiohttpTransport

from roundtrip._broker.embedded import free_port
from roundtrip._gate.gate import Gate
from roundtrip._gate.validation import GateValidator, InputValidator
from roundtrip._kernel.wire.events import CheckToolCalls, ToolCall, Turn
from roundtrip._shop.agent.client import ShopClient
from tests.agents import SHOP, shop_deps
from tests.gate_calls import check_call
from tests.signing import pair

REGISTRY = SHOP.registry

# What models send: mostly valid calls, some with the usual mistakes.
VALIDATION_MIX: list[tuple[str, Any]] = [
    ("list_orders", {}),
    ("list_orders", {"status": "processing", "limit": 5}),
    ("lookup_order", {"order_id": "ord_a1000003"}),
    ("get_shipping_status", {"order_id": "ord_a1000002"}),
    ("cancel_order", {"order_id": "ord_a1000003", "reason": "customer_request"}),
    ("search_help_center", {"query": "refund time"}),
    ("escalate_to_human", {"summary": "Customer needs the shipped order ord_a1000002 stopped", "urgency": "high"}),
    ("list_orders", {"limit": "five"}),
    ("cancel_order", {"order_id": "ord_a1000003", "reason": "changed_my_mind"}),
    ("lookup_order", {"order_id": "ORD_A1000003"}),
]

# Calls that reach authorization (valid), own and foreign orders, for customer cus_1001.
AUTH_MIX: list[tuple[str, Any]] = [
    ("lookup_order", {"order_id": "ord_a1000003"}),
    ("get_shipping_status", {"order_id": "ord_a1000002"}),
    ("cancel_order", {"order_id": "ord_a1000004", "reason": "customer_request"}),
    ("cancel_order", {"order_id": "ord_9f3c4e21", "reason": "customer_request"}),  # another customer's
    ("lookup_order", {"order_id": "ord_0000beef"}),  # does not exist
    ("list_orders", {"limit": 5}),
]

STEP_1 = [("cancel_order", {"order_id": "ord_a1000004", "reason": "customer_request"})]
STEP_3 = [
    ("lookup_order", {"order_id": "ord_a1000003"}),
    ("get_shipping_status", {"order_id": "ord_a1000002"}),
    ("cancel_order", {"order_id": "ord_a1000003", "reason": "customer_request"}),
]


def tool_calls(mix: list[tuple[str, Any]]) -> list[ToolCall]:
    return [ToolCall(id=f"toolu_{i}", name=n, input=inp, fingerprint="fp") for i, (n, inp) in enumerate(mix)]


def rate(fn: Callable[[], int], seconds: float) -> float:
    """Calls per second of fn (which returns how many calls it made), over about `seconds`."""
    done, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        done += fn()
    return done / elapsed


async def arate(fn: Callable[[], Awaitable[int]], seconds: float) -> float:
    done, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        done += await fn()
    return done / elapsed


def start_shop(port: int, folder: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "roundtrip._shop", "--port", str(port), "--database-url", f"sqlite+aiosqlite:///{folder}/shop.db"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ},
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.1)  # poll interval: the shop answering its health probe
    proc.kill()
    raise RuntimeError("the shop did not start")


def make_gate(shop: ShopClient, **options: Any) -> Gate:
    async def lookup(kind: str, entity_id: str, customer_id: str):
        return await shop.get_order(customer_id, entity_id)

    return Gate(
        registry=REGISTRY,
        lookup=lookup,
        signer=pair("k1").signer,
        deps=shop_deps(shop),
        agent_settings=SHOP.own_settings,
        **options,
    )


CONFIGS: dict[str, dict[str, Any]] = {
    "no cache, sequential": {"step_memo": False, "ownership_ttl_s": 0, "concurrent": False},
    "step memo, sequential": {"step_memo": True, "ownership_ttl_s": 0, "concurrent": False},
    "step memo, concurrent": {"step_memo": True, "ownership_ttl_s": 0, "concurrent": True},
    "step memo + ownership TTL 30 s, concurrent": {"step_memo": True, "ownership_ttl_s": 30.0, "concurrent": True},
}


class RecompiledPerCall(InputValidator):
    """Compiles the tool's schema again on every call: what compiling it once per tool saves."""

    def problems(self, tool_input: Any) -> list[str]:
        self._validator = GateValidator(self._validator.schema, format_checker=GateValidator.FORMAT_CHECKER)
        return super().problems(tool_input)


async def bench(seconds: float, steps: int) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []

    # 1. validation only
    calls = tool_calls(VALIDATION_MIX)
    for label, kind in (("compiled once per tool", InputValidator), ("re-created per call", RecompiledPerCall)):
        validators = {n: kind(s.input_schema) for n, s in REGISTRY.specs.items()}
        per_s = rate(
            lambda validators=validators: sum(1 for c in calls if validators[c.name].problems(c.input) is not None),
            seconds,
        )
        rows.append((f"validation only, Draft202012Validator {label}", f"{per_s:,.0f} calls/s"))

    port = free_port()
    with tempfile.TemporaryDirectory() as folder:
        proc = start_shop(port, Path(folder))
        try:
            async with ShopClient(f"http://127.0.0.1:{port}", timeout=5, transport=AiohttpTransport()) as shop:
                turn = Turn(turn_id="turn_b", request_id="r", conversation_id="c", customer_id="cus_1001")

                # 2. validation + authorization throughput (one call at a time, as check_call sees them)
                auth_calls = tool_calls(AUTH_MIX)
                for name in ("no cache, sequential", "step memo + ownership TTL 30 s, concurrent"):
                    gate = make_gate(shop, **CONFIGS[name])

                    async def one_pass(gate=gate) -> int:
                        for c in auth_calls:
                            await check_call(gate, c, "cus_1001", "turn_b")
                        return len(auth_calls)

                    await one_pass()  # warm up connections
                    per_s = await arate(one_pass, seconds)
                    rows.append(
                        (f"validation + authorization over HTTP, {name.split(',')[0]}", f"{per_s:,.0f} calls/s")
                    )

                # 3. added latency per step: check() = validate + authorize + sign
                for label, mix in (("1 call", STEP_1), ("3 calls", STEP_3)):
                    command = CheckToolCalls(
                        turn=turn,
                        step=1,
                        messages=[{"role": "user", "content": "cancel my order"}],
                        calls=tool_calls(mix),
                    )
                    for name, options in CONFIGS.items():
                        gate = make_gate(shop, **options)
                        await gate.check(command)
                        samples = []
                        for _ in range(steps):
                            start = time.perf_counter()
                            await gate.check(command)
                            samples.append((time.perf_counter() - start) * 1000)
                        q = statistics.quantiles(samples, n=100)
                        rows.append((f"step of {label}: {name}", f"p50 {q[49]:.2f} ms, p99 {q[98]:.2f} ms"))
        finally:
            proc.terminate()
            proc.wait(10)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.bench_gate")
    parser.add_argument("--seconds", type=float, default=2.0, help="measuring time per throughput figure")
    parser.add_argument("--steps", type=int, default=300, help="steps per latency figure")
    args = parser.parse_args(argv)
    rows = asyncio.run(bench(args.seconds, args.steps))
    width = max(len(r[0]) for r in rows)
    print(f"{'measurement':<{width}}  result")
    print(f"{'-' * width}  {'-' * 32}")
    for what, result in rows:
        print(f"{what:<{width}}  {result}")
    print(f"\n(python {sys.version.split()[0]}, {os.cpu_count()} cpus; shop: uvicorn + SQLite on 127.0.0.1)")


if __name__ == "__main__":
    main()
