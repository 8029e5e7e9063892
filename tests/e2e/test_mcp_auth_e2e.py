"""MCP servers that require credentials, end to end (issue 43, item 4): the fleet runs tests/mcp_auth_agent.py, whose
two servers are real servers of the `mcp` package (tests/mcp_auth_server.py, each its own process, logging every call
it receives): giftwrap wants a bearer token (the fleet's from a mounted secret file), engraving an OAuth token from a
real authorization server (tests/oauth_server.py, authlib's, its own process) that the fleet gets with client
credentials through the `mcp` package's provider.

One story, in order: every service lists both servers with their credentials; a call to each reaches it with the
request's customer and the turn's trace id in its `_meta` traceparent (engraving: as the OAuth client `roundtrip`),
and the server's own span (the `mcp` package's, exported to the fleet's span file) is in the turn's trace under the
executor's, where `roundtrip trace` shows it;
the server's token is changed (the fleet's is revoked) and a giftwrap call is an `is_error` result that never reaches
it, while engraving and a local tool serve on, with one log line naming the server; the OAuth client is revoked at the
authorization server and an engraving call is an `is_error` result too; no secret is in any log of the fleet.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest

from roundtrip._broker.embedded import free_port
from roundtrip._fleet.launcher import Fleet
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire.events import Outcome
from tests.e2e.conftest import FleetClient, fleet_env
from tests.e2e.test_gate_e2e import _tool_results
from tests.e2e.test_mcp_e2e import wait_until
from tests.mcp_server import answers, calls
from tests.signing import key_settings

CUSTOMER, OWN_ORDER = "cus_1001", "ord_a1000001"
TOKEN, SECRET = f"tok-{uuid.uuid4().hex}", f"secret-{uuid.uuid4().hex}"
SERVICES = ("model", "gate", "executor")


def listed_everywhere(logs: Path, server: str, tool: str) -> bool:
    line = f"MCP server {server} is up: mounted ['{tool}']"
    names = [p for p in logs.glob("*.log") if p.stem.split("-")[0] in SERVICES]
    return len(names) >= 3 and all(line in p.read_text(encoding="utf-8", errors="replace") for p in names)


def fleet_logs(logs: Path) -> str:
    return "".join(p.read_text(encoding="utf-8", errors="replace") for p in sorted(logs.glob("*.log")))


def spawn(args: list[str], out: Path) -> subprocess.Popen:
    with out.open("ab") as sink:
        return subprocess.Popen([sys.executable, "-m", *args], stdout=sink, stderr=sink)


@pytest.fixture(scope="module")
async def guarded(kafka_bootstrap, tmp_path_factory):
    """The authorization server and both MCP servers, up; then a fleet of its own running the agent; its client."""
    state = tmp_path_factory.mktemp("mcpauth")
    ports = {name: free_port() for name in ("oauth", "giftwrap", "engraving")}
    issuer = f"http://127.0.0.1:{ports['oauth']}"
    files = {
        "clients": state / "clients.json",
        "server_token": state / "server-token",
        "fleet_token": state / "fleet-token",
        "giftwrap": state / "giftwrap.jsonl",
        "engraving": state / "engraving.jsonl",
        "logs": state / "logs",
        "spans": state / "spans.jsonl",  # the fleet's span file (state_dir/spans.jsonl)
    }
    files["clients"].write_text(json.dumps({"roundtrip": SECRET}))
    files["server_token"].write_text(TOKEN)
    files["fleet_token"].write_text(TOKEN + "\n")  # as a Secret is mounted: the newline is not part of it
    urls = {name: f"http://127.0.0.1:{ports[name]}/mcp" for name in ("giftwrap", "engraving")}
    processes = [
        spawn(["tests.oauth_server", str(ports["oauth"]), str(files["clients"])], state / "oauth.out"),
        spawn(
            [
                "tests.mcp_auth_server",
                str(ports["giftwrap"]),
                str(files["giftwrap"]),
                "gift_wrap_order",
                "token",
                str(files["server_token"]),
                str(files["spans"]),
            ],
            state / "giftwrap.out",
        ),
        spawn(
            [
                "tests.mcp_auth_server",
                str(ports["engraving"]),
                str(files["engraving"]),
                "engrave_order",
                "oauth",
                issuer,
                str(files["spans"]),
            ],
            state / "engraving.out",
        ),
    ]
    fleet = None
    try:
        for url in (issuer, *urls.values()):
            await wait_until(lambda url=url: answers(url), f"{url} answering")
        values = dict(
            kafka_bootstrap_servers=kafka_bootstrap,
            kafka_allow_plaintext=True,  # the test broker listens in the clear; the fleet is not development
            topic_prefix=f"mcpauth{uuid.uuid4().hex[:6]}.",
            state_dir=state,
            simulator_port=free_port(),
            console_port=free_port(),
            shop_port=free_port(),
            partitions=2,
            log_level="INFO",
            **key_settings("e2e1"),  # fresh pairs, never the published development keys
            agent="tests.mcp_auth_agent:AGENT",
        )
        settings = Settings(**values)
        env = {
            **fleet_env(**values),
            "ROUNDTRIP_MCP_GIFTWRAP_URL": urls["giftwrap"],
            "ROUNDTRIP_MCP_ENGRAVING_URL": urls["engraving"],
            "MCP_TEST_TOKEN_FILE": str(files["fleet_token"]),
            "MCP_TEST_ISSUER": issuer,
            "MCP_TEST_CLIENT_SECRET": SECRET,
        }
        fleet = Fleet(settings, env=env)
        await asyncio.to_thread(fleet.start)
        client = FleetClient(settings)
        await client.start()
        try:
            yield client, files, issuer, env
        finally:
            await client.stop()
    finally:
        if fleet is not None:
            await asyncio.to_thread(fleet.stop)
        for process in processes:
            process.terminate()
            process.wait(10)


async def ask(client, tool: str, args: dict):
    request_id = await client.ask(f"{tool} {json.dumps(args)}", customer=CUSTOMER, persona="direct")
    reply = await client.reply(request_id, timeout=90)
    return reply, _tool_results(client, request_id)


def trace_id_of(traceparent: str | None) -> str | None:
    return traceparent.split("-")[1] if traceparent else None


def spans_of(path: Path, trace_id: str) -> list[dict]:
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    return [span for span in map(json.loads, filter(None, lines)) if span["trace_id"] == trace_id]


def server_span_under_the_executor(path: Path, trace_id: str, tool: str) -> dict | None:
    """The MCP server's own span of the call (`mcp` package: `tools/call TOOL`, kind SERVER), once the fleet's span
    it is the child of (an executor's) is in the file too (the fleet's spans are written in batches)."""
    spans = spans_of(path, trace_id)
    by_id = {span["span_id"]: span for span in spans}
    for span in spans:
        if span["service"] == f"mcp-{tool}" and span["name"] == f"tools/call {tool}" and span["kind"] == "SERVER":
            parent = by_id.get(span["parent_id"])
            if parent is not None and parent["service"] == "roundtrip-executor":
                return span
    return None


async def test_mcp_servers_with_credentials_through_the_fleet(guarded):
    client, files, issuer, env = guarded
    await wait_until(lambda: listed_everywhere(files["logs"], "giftwrap", "gift_wrap_order"), "giftwrap listed")
    await wait_until(lambda: listed_everywhere(files["logs"], "engraving", "engrave_order"), "engraving listed")
    card = {"order_id": OWN_ORDER, "message": "Happy birthday"}

    # with the bearer token: the call reaches the server, for the customer, in the turn's trace
    reply, results = await ask(client, "gift_wrap_order", card)
    assert reply.outcome is Outcome.END_TURN and len(results) == 1 and not results[0].get("is_error"), results
    (reached,) = calls(files["giftwrap"])
    assert reached["customer_id"] == CUSTOMER and reached["client_id"] == "static"
    assert trace_id_of(reached["traceparent"]) == reply.trace_id, (reached, reply.trace_id)
    # the server's own span is in the turn's trace, under the executor's, and `roundtrip trace` shows it
    await wait_until(
        lambda: server_span_under_the_executor(files["spans"], reply.trace_id, "gift_wrap_order") is not None,
        "the MCP server's span under the executor's in the turn's trace",
    )
    roundtrip = str(Path(sys.executable).with_name("roundtrip"))
    shown = await asyncio.to_thread(
        subprocess.run,
        [roundtrip, "trace", reply.trace_id],
        env={**os.environ, **env, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown
    rows = shown.stdout.splitlines()
    assert any("mcp-gift_wrap_order" in row and "tools/call gift_wrap_order" in row for row in rows), shown.stdout

    # with an OAuth token of the client `roundtrip`, from the authorization server
    reply, results = await ask(client, "engrave_order", card)
    assert reply.outcome is Outcome.END_TURN and not results[0].get("is_error"), results
    (reached,) = calls(files["engraving"])
    assert reached["client_id"] == "roundtrip" and reached["customer_id"] == CUSTOMER
    assert trace_id_of(reached["traceparent"]) == reply.trace_id
    await wait_until(
        lambda: server_span_under_the_executor(files["spans"], reply.trace_id, "engrave_order") is not None,
        "the engraving server's span under the executor's in the turn's trace",
    )

    # the server's token changes: the fleet's is refused, an is_error result; the other tools serve on
    files["server_token"].write_text(f"tok-{uuid.uuid4().hex}")
    reply, results = await ask(client, "gift_wrap_order", card)
    assert reply.outcome is Outcome.END_TURN and results[0]["is_error"], results
    assert "did not accept the fleet's credentials" in results[0]["content"]
    assert len(calls(files["giftwrap"])) == 1
    reply, results = await ask(client, "engrave_order", card)
    assert reply.outcome is Outcome.END_TURN and not results[0].get("is_error"), results
    reply, results = await ask(client, "lookup_order", {"order_id": OWN_ORDER})
    assert reply.outcome is Outcome.END_TURN and not results[0].get("is_error"), results
    refused = [
        line
        for line in fleet_logs(files["logs"]).splitlines()
        if "MCP server giftwrap" in line and "refused the credentials" in line
    ]
    assert len(refused) == 1 and f"bearer token (file {files['fleet_token']})" in refused[0], refused

    # the OAuth client is revoked at the authorization server: its token is inactive, no new one is given
    (await asyncio.to_thread(httpx.post, f"{issuer}/revoke-client/roundtrip")).raise_for_status()
    reply, results = await ask(client, "engrave_order", card)
    assert reply.outcome is Outcome.END_TURN and results[0]["is_error"], results
    assert "did not accept the fleet's credentials" in results[0]["content"]
    assert len(calls(files["engraving"])) == 2
    assert any(
        "MCP server engraving" in line and "refused the credentials OAuth client credentials" in line
        for line in fleet_logs(files["logs"]).splitlines()
    )

    # `roundtrip agent check` says which server refused which credentials, by their source
    checked = await asyncio.to_thread(
        subprocess.run,
        [roundtrip, "agent", "check", "tests.mcp_auth_agent:AGENT"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert checked.returncode == 1, checked
    lines = checked.stdout.splitlines()
    assert any(
        "MCP server giftwrap" in line and f"refused the credentials bearer token (file {files['fleet_token']})" in line
        for line in lines
    ), checked.stdout
    assert any(
        "MCP server engraving" in line and "refused the credentials OAuth client credentials (client roundtrip" in line
        for line in lines
    ), checked.stdout

    # no secret is in any log of the fleet, nor in what the check printed
    text = fleet_logs(files["logs"]) + checked.stdout + checked.stderr
    assert TOKEN not in text and SECRET not in text
