"""MCP tools end to end (issue 19, item 3): the fleet runs tests/mcp_agent.py (the shop's agent plus the MCP tool
`gift_wrap_order` of tests/mcp_server.py, a real server of the `mcp` package started as its own process, which logs
every call it receives). The `direct` persona makes the call the test writes, only if the model was offered that tool.

One story, in order: the services start while the server is down (none crash-loops; the model is not offered the
tool); the server comes up and every service mounts it; a valid call reaches it and the turn ends end_turn; an
`isError` result, an invalid call and a call naming another customer's order give `is_error` results, and the last
two never reach the server; the server goes down mid-run and a call gives an `is_error` result, not a stuck turn.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import pytest

from roundtrip._broker.embedded import free_port
from roundtrip._fleet.launcher import Fleet
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire.events import Outcome
from tests.e2e.conftest import FleetClient, fleet_env
from tests.e2e.test_gate_e2e import _tool_results
from tests.mcp_server import TOOL, answers, calls, start
from tests.signing import key_settings

CUSTOMER, OWN_ORDER, FOREIGN_ORDER = "cus_1001", "ord_a1000001", "ord_9f3c4e21"  # ord_9f3c4e21 is cus_1002's
LISTED = "MCP server giftwrap is up: mounted ['gift_wrap_order']"


async def wait_until(predicate, what: str, timeout: float = 60.0) -> None:
    for _ in range(int(timeout / 0.2)):
        if predicate():
            return
        await asyncio.sleep(0.2)  # poll interval: the condition awaited (the fleet's logs)
    raise AssertionError(f"{what} did not happen within {timeout:g} s")


def listed_everywhere(logs: Path) -> bool:
    names = [p for p in logs.glob("*.log") if p.stem.split("-")[0] in ("model", "gate", "executor")]
    return len(names) >= 3 and all(LISTED in p.read_text(encoding="utf-8", errors="replace") for p in names)


@pytest.fixture(scope="module")
async def giftwrap(kafka_bootstrap, tmp_path_factory):
    """A fleet of its own running the MCP agent from its start (one parallel start, not five restarts of the
    session's fleet), with the URL of an MCP server that is not running yet; its client; the server's files."""
    state = tmp_path_factory.mktemp("mcp")
    port = free_port()
    server = {
        "log": state / "calls.jsonl",
        "out": state / "server.out",
        "port": port,
        "url": f"http://127.0.0.1:{port}/mcp",
        "process": None,
        "logs": state / "logs",
    }
    values = dict(
        kafka_bootstrap_servers=kafka_bootstrap,
        kafka_allow_plaintext=True,  # the test broker listens in the clear; the fleet is not development
        topic_prefix=f"mcp{uuid.uuid4().hex[:6]}.",
        state_dir=state,
        simulator_port=free_port(),
        console_port=free_port(),
        shop_port=free_port(),
        partitions=2,
        log_level="INFO",
        **key_settings("e2e1"),  # fresh pairs, never the published development keys
        agent="tests.mcp_agent:AGENT",
    )
    settings = Settings(**values)
    env = {**fleet_env(**values), "ROUNDTRIP_MCP_GIFTWRAP_URL": server["url"]}
    fleet = Fleet(settings, env=env)
    await asyncio.to_thread(fleet.start)  # blocking (and it runs an event loop of its own to migrate the ledger)
    client = FleetClient(settings)
    try:
        await client.start()
        try:
            yield client, server
        finally:
            await client.stop()
    finally:
        await asyncio.to_thread(fleet.stop)
        if server["process"] is not None and server["process"].poll() is None:
            server["process"].terminate()
            server["process"].wait(10)


async def ask(client, text: str):
    request_id = await client.ask(text, customer=CUSTOMER, persona="direct")
    reply = await client.reply(request_id, timeout=90)
    return reply, _tool_results(client, request_id)


def wrap(order_id: str, message) -> str:
    return f"{TOOL} " + json.dumps({"order_id": order_id, "message": message})


async def test_mcp_tools_through_the_fleet(giftwrap):
    client, server = giftwrap

    # the server is down: every service started anyway, and the model is not offered its tool
    reply, results = await ask(client, wrap(OWN_ORDER, "Happy birthday"))
    assert reply.outcome is Outcome.END_TURN and results == [] and f"no tool {TOOL}" in reply.text, reply

    server["process"] = start(server["port"], server["log"], server["out"])
    await wait_until(lambda: answers(server["url"]), "the MCP server answering")
    await wait_until(
        lambda: listed_everywhere(server["logs"]), "model, gate and executors listing the MCP server (retried)"
    )

    # a valid call reaches the server, for the request's customer, and the turn ends normally
    reply, results = await ask(client, wrap(OWN_ORDER, "Happy birthday"))
    assert reply.outcome is Outcome.END_TURN, reply
    assert (
        len(results) == 1
        and not results[0].get("is_error")
        and json.loads(results[0]["content"])["gift_wrapped"] is True
    )
    assert calls(server["log"]) == [
        {"tool": TOOL, "arguments": {"order_id": OWN_ORDER, "message": "Happy birthday"}, "customer_id": CUSTOMER}
    ]

    # the server's isError result is the model's is_error tool_result
    reply, results = await ask(client, wrap(OWN_ORDER, "out of paper"))
    assert reply.outcome is Outcome.END_TURN and results[0]["is_error"] and "out of paper" in results[0]["content"]
    reached = calls(server["log"])
    assert len(reached) == 2

    # an invalid call and a call naming another customer's order are refused by the gate and never reach the server
    reply, results = await ask(client, wrap(OWN_ORDER, 5))
    assert (
        reply.outcome is Outcome.END_TURN
        and results[0]["is_error"]
        and "`message` must be of type string" in results[0]["content"]
    )
    reply, results = await ask(client, wrap(FOREIGN_ORDER, "Happy birthday"))
    assert reply.outcome is Outcome.END_TURN and results[0]["is_error"]
    assert "not found among this customer's orders" in results[0]["content"]
    assert calls(server["log"]) == reached

    # the server goes down mid-run: the call gives an is_error result and the turn ends, it is not stuck
    server["process"].terminate()
    server["process"].wait(10)
    reply, results = await ask(client, wrap(OWN_ORDER, "Happy birthday"))
    assert reply.outcome is Outcome.END_TURN, reply
    assert results[0]["is_error"] and "giftwrap service could not be reached" in results[0]["content"]
    assert calls(server["log"]) == reached
