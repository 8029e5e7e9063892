"""MCP tools with a fake MCP client: listing (and its retries), mounting with the agent's annotations, the gate's
checks of a mounted tool, the executor's calls, and the agent's declaration checks."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from mcp.shared.exceptions import MCPError

from roundtrip._executor.runner import Runner
from roundtrip._gate.gate import Gate
from roundtrip._kernel.wire.events import CheckedCall, ToolCall, Turn
from roundtrip._sdk.agent import AgentError
from roundtrip._sdk.context import Dependencies, ToolContext, ToolError
from roundtrip._sdk.mcp import McpMount, McpServer, result_of, strict_copy
from roundtrip._sdk.registry import RegistryError, check_tool_document
from roundtrip._sdk.sources import Toolbox
from tests.agents import SHOP, tool_runner
from tests.gate_calls import check_call
from tests.signing import pair

WRAP_SCHEMA = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string"},
        "message": {"type": "string", "maxLength": 80},
        "ribbon": {"type": "object", "properties": {"color": {"type": "string"}}},
    },
    "required": ["order_id", "message"],
}
WRAP = SimpleNamespace(
    name="gift_wrap_order", description="Gift-wrap one of the customer's orders, with a card.", input_schema=WRAP_SCHEMA
)
SERVER = McpServer("giftwrap", url="http://mcp.test/mcp", entities={"gift_wrap_order": {"order_id": "order"}})


class FakeMcp:
    """Stands in for mcp.Client: down until `up`, then lists `tools` and answers calls with `answer`."""

    def __init__(self, tools=(WRAP,), up: bool = True) -> None:
        self.tools, self.up, self.calls, self.listings = list(tools), up, [], 0
        self.answer: Any = SimpleNamespace(
            content=[SimpleNamespace(type="text", text='{"gift_wrapped": true}')],
            structured_content=None,
            is_error=False,
        )

    def __call__(self, url: str) -> FakeMcp:
        return self

    async def __aenter__(self) -> FakeMcp:
        if not self.up:
            raise ExceptionGroup(
                "unhandled errors in a TaskGroup", [ConnectionRefusedError("All connection attempts failed")]
            )
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    @contextlib.asynccontextmanager
    async def connection(self, answers: list[int]) -> AsyncIterator[FakeMcp]:
        """McpMount.connection's stand-in: this client over no HTTP."""
        async with self as client:
            yield client

    async def list_tools(self, cursor=None):
        self.listings += 1
        return SimpleNamespace(tools=self.tools, next_cursor=None)

    async def call_tool(self, name, arguments, meta=None):
        self.calls.append((name, arguments, meta))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def fake_mount(fake: FakeMcp, server: McpServer = SERVER, url: str | None = None) -> McpMount:
    """A mount of `server` whose connections are `fake`'s."""
    mount = McpMount(server, server.url_for(None) if url is None else url, None)
    mount.connection = fake.connection
    return mount


def mounted(fake: FakeMcp, server: McpServer = SERVER, **agent_fields: Any):
    agent = dataclasses.replace(SHOP, mcp_servers=[server], **agent_fields).check()
    tools = Toolbox([fake_mount(fake, server)], agent.registry)
    return agent, tools


def ctx() -> ToolContext:
    return ToolContext(customer_id="cus_1001", tool_use_id="toolu_1", idempotency_key="turn_1:toolu_1")


# -- the schema the model and the gate see ---------------------------------------------------------


def test_a_listed_schema_is_closed_annotated_and_passes_the_local_strictness_checks():
    spec = check_tool_document(strict_copy(SERVER, WRAP), source="MCP server giftwrap")
    assert spec.entity_refs == {"order_id": "order"}
    assert spec.input_schema["additionalProperties"] is False
    assert spec.input_schema["properties"]["ribbon"]["additionalProperties"] is False  # nested objects too
    assert "x-entity" not in json.dumps(spec.api_tool())  # the model never sees the annotation
    assert WRAP_SCHEMA.get("additionalProperties") is None  # the server's listing is not changed


def test_a_schema_without_the_annotated_argument_or_explicitly_open_is_refused():
    renamed = SimpleNamespace(
        **{**vars(WRAP), "input_schema": {"type": "object", "properties": {"order": {"type": "string"}}}}
    )
    with pytest.raises(RegistryError, match="annotates its argument 'order_id'"):
        strict_copy(SERVER, renamed)
    open_ = SimpleNamespace(**{**vars(WRAP), "input_schema": {**WRAP_SCHEMA, "additionalProperties": True}})
    with pytest.raises(RegistryError, match="additionalProperties: false"):
        check_tool_document(strict_copy(SERVER, open_), "MCP server giftwrap")


def test_a_short_description_and_a_missing_required_are_filled_in():
    bare = SimpleNamespace(name="ping", description=None, input_schema={"type": "object", "properties": {}})
    doc = strict_copy(McpServer("ops"), bare)
    assert doc["input_schema"]["required"] == [] and "ops" in doc["description"]
    check_tool_document(doc, "<tool>")


def test_results_become_the_handlers_value_or_a_tool_error():
    text = SimpleNamespace(
        content=[SimpleNamespace(type="text", text='{"a": 1}')], structured_content=None, is_error=False
    )
    assert result_of("t", text) == {"a": 1}
    plain = SimpleNamespace(
        content=[SimpleNamespace(type="text", text="wrapped")], structured_content=None, is_error=False
    )
    assert result_of("t", plain) == {"content": "wrapped"}
    structured = SimpleNamespace(content=[], structured_content={"b": 2}, is_error=False)
    assert result_of("t", structured) == {"b": 2}
    failed = SimpleNamespace(
        content=[SimpleNamespace(type="text", text="out of paper")], structured_content=None, is_error=True
    )
    with pytest.raises(ToolError, match="out of paper"):
        result_of("t", failed)


# -- listing, retries, mounting --------------------------------------------------------------------


async def test_a_server_down_at_start_is_refused_clearly_then_mounted_once_it_answers(monkeypatch):
    monkeypatch.setattr("roundtrip._sdk.mcp.FIRST_RETRY_S", 0.01)
    fake = FakeMcp(up=False)
    agent, tools = mounted(fake, dataclasses.replace(SERVER, retry_max_s=0.02))
    await tools.start()  # returns after the first attempt: the service starts anyway
    try:
        assert "gift_wrap_order" not in agent.registry
        assert "giftwrap service it belongs to cannot be reached" in tools.unavailable("gift_wrap_order")
        assert [t["name"] for t in tools.api_tools] == agent.registry.names  # the model sees only the local tools
        fake.up = True
        for _ in range(500):
            if "gift_wrap_order" in agent.registry:
                break
            await asyncio.sleep(0.01)  # poll interval: the tool mounted once the server answers
        assert "gift_wrap_order" in agent.registry
        assert tools.unavailable("gift_wrap_order") is None
        assert "gift_wrap_order" in [t["name"] for t in tools.api_tools]  # the same list object, now with it
        assert tools.api_tools[-1].get("cache_control")  # still one prompt-cache breakpoint, on the last tool
    finally:
        await tools.aclose()


async def test_only_the_declared_tools_are_mounted_and_a_declared_tool_not_listed_is_refused():
    other = SimpleNamespace(
        name="delete_everything",
        description="Deletes every order of every customer.",
        input_schema={"type": "object", "properties": {}},
    )
    fake = FakeMcp(tools=[WRAP, other])
    server = dataclasses.replace(SERVER, tools=["gift_wrap_order", "track_gift"])
    agent, tools = mounted(fake, server)
    await tools.start()
    await tools.aclose()
    assert "gift_wrap_order" in agent.registry and "delete_everything" not in agent.registry
    assert "not offered" in tools.unavailable("track_gift")
    assert tools.unavailable("delete_everything") is None and tools.owner("delete_everything") is None


async def test_a_listed_tool_named_like_a_local_one_is_refused():
    clash = SimpleNamespace(
        name="list_orders",
        description="Lists orders, the server's way of doing it.",
        input_schema={"type": "object", "properties": {}},
    )
    agent, tools = mounted(FakeMcp(tools=[clash]), dataclasses.replace(SERVER, tools="all"))
    await tools.start()
    await tools.aclose()
    assert "declares no entities for this one" in tools.refused["list_orders"]
    assert agent.registry.handler("list_orders") is SHOP.handlers["list_orders"]
    with pytest.raises(AgentError, match=r"named like a local tool: \['list_orders'\]"):
        mounted(FakeMcp(tools=[clash]), dataclasses.replace(SERVER, tools="all", entities={"list_orders": {}}))


# A tool the server adds after the agent was written: it names no entity the agent knows of, so nothing would check
# the ids it takes.
LATER = SimpleNamespace(
    name="transfer_gift",
    description="Moves a gift wrap from one order to another order.",
    input_schema={"type": "object", "properties": {"from_order": {"type": "string"}, "to_order": {"type": "string"}}},
)


async def test_a_tool_the_server_adds_later_is_not_mounted_when_the_agent_names_its_tools():
    for server in (SERVER, dataclasses.replace(SERVER, tools=["gift_wrap_order"])):
        agent, tools = mounted(FakeMcp(tools=[WRAP, LATER]), server)
        await tools.start()
        await tools.aclose()
        assert "gift_wrap_order" in agent.registry and "transfer_gift" not in agent.registry
        assert "transfer_gift" not in [t["name"] for t in tools.api_tools]  # the model never sees it
        assert tools.owner("transfer_gift") is None and tools.unavailable("transfer_gift") is None


async def test_all_tools_mounts_only_those_the_agent_declares_the_entities_of_and_names_the_others():
    every = dataclasses.replace(SERVER, tools="all")
    agent, tools = mounted(FakeMcp(tools=[WRAP, LATER]), every)
    assert await tools.problems() == [
        "MCP tool transfer_gift not mounted: the agent takes all of its server's tools but declares no entities for "
        "this one (name it in McpServer's entities, with {} if none of its arguments is an entity id)"
    ]
    assert "gift_wrap_order" in agent.registry and "transfer_gift" not in agent.registry
    refused = await check_call(
        gate_for(agent, tools),
        ToolCall(id="toolu_2", name="transfer_gift", input={"from_order": "a", "to_order": "b"}, fingerprint="f"),
        "cus_1001",
        "t",
    )
    assert not refused.approved
    declared = dataclasses.replace(
        every, entities={**every.entities, "transfer_gift": {"from_order": "order", "to_order": "order"}}
    )
    agent, tools = mounted(FakeMcp(tools=[WRAP, LATER]), declared)
    assert await tools.problems() == []
    assert agent.registry.get("transfer_gift").entity_refs == {"from_order": "order", "to_order": "order"}


async def test_problems_name_a_server_that_does_not_answer_a_declared_tool_it_does_not_list_and_a_refused_one():
    down = Toolbox([fake_mount(FakeMcp(up=False), SERVER, "https://u:secret@mcp.test/mcp")], SHOP.registry)
    assert await down.problems() == [
        "MCP server giftwrap (https://mcp.test/mcp) does not answer: "
        "ConnectionRefusedError: All connection attempts failed"
    ]
    clash = SimpleNamespace(
        name="list_orders",
        description="Lists orders, the server's way of doing it.",
        input_schema={"type": "object", "properties": {}},
    )
    every_tool = McpServer("giftwrap", url="u", tools="all", entities={"track_gift": {"order_id": "order"}})
    _, tools = mounted(FakeMcp(tools=[clash]), every_tool)
    problems = await tools.problems()
    assert problems[0] == "MCP server giftwrap does not list ['track_gift'], which the agent declares"
    assert problems[1].startswith("MCP tool list_orders not mounted: the agent takes all of its server's tools")


# -- the gate and the executor ---------------------------------------------------------------------


async def owned_orders(kind: str, entity_id: str, customer_id: str):
    return {"order_id": entity_id, "customer_id": "cus_1001"} if entity_id == "ord_a1000001" else None


def gate_for(agent, tools) -> Gate:
    return Gate(
        registry=agent.registry,
        lookup=owned_orders,
        signer=pair("k1").signer,
        agent_settings=agent.own_settings,
        unavailable=tools.unavailable,
    )


def wrap_call(**arguments: Any) -> ToolCall:
    return ToolCall(id="toolu_1", name="gift_wrap_order", input=arguments, fingerprint="fp")


async def test_the_gate_checks_a_mounted_tool_like_a_local_one():
    agent, tools = mounted(FakeMcp())
    await tools.start()
    await tools.aclose()
    gate = gate_for(agent, tools)
    ok = await check_call(gate, wrap_call(order_id="ord_a1000001", message="Happy birthday"), "cus_1001", "t")
    assert ok.approved
    extra = await check_call(gate, wrap_call(order_id="ord_a1000001", message="hi", gift=True), "cus_1001", "t")
    too_long = await check_call(gate, wrap_call(order_id="ord_a1000001", message="x" * 81), "cus_1001", "t")
    foreign = await check_call(gate, wrap_call(order_id="ord_9f3c4e21", message="hi"), "cus_1001", "t")
    assert not extra.approved and "gift" in extra.error
    assert not too_long.approved and "message" in too_long.error
    assert not foreign.approved and "not found among this customer's orders" in foreign.error


async def test_the_gate_refuses_a_tool_of_a_server_it_could_not_list():
    agent, tools = mounted(FakeMcp(up=False))
    await tools.start()
    await tools.aclose()
    refused = await check_call(
        gate_for(agent, tools), wrap_call(order_id="ord_a1000001", message="hi"), "cus_1001", "t"
    )
    assert not refused.approved and "cannot be reached right now; nothing was done" in refused.error


async def test_the_agents_policies_and_approval_rules_bind_to_mcp_tools_by_name():
    async def no_wrapping(args, entities, ctx):
        return "gift wrapping is paused"

    agent, tools = mounted(FakeMcp(), policies={**SHOP.policies, "gift_wrap_order": no_wrapping})
    await tools.start()
    await tools.aclose()
    denied = await check_call(gate_for(agent, tools), wrap_call(order_id="ord_a1000001", message="hi"), "cus_1001", "t")
    assert not denied.approved and "gift wrapping is paused" in denied.error


def executor(agent, tools) -> Runner:
    return tool_runner(agent.registry, Dependencies(), timeout_s=2.0, fallback=tools.handler)


TURN = Turn(turn_id="turn_1", request_id="req_1", conversation_id="conv_1", customer_id="cus_1001")
APPROVED = CheckedCall(
    id="toolu_1", name="gift_wrap_order", input={"order_id": "ord_a1000001", "message": "hi"}, approved=True
)


async def test_the_executor_calls_the_tool_with_the_principal_and_idempotency_key_in_meta():
    fake = FakeMcp()
    agent, tools = mounted(fake)
    await tools.start()
    await tools.aclose()
    result = await executor(agent, tools).run_one(APPROVED, TURN)
    assert not result.get("is_error") and json.loads(result["content"]) == {"gift_wrapped": True}
    assert fake.calls == [
        (
            "gift_wrap_order",
            APPROVED.input,
            {"roundtrip/customer_id": "cus_1001", "roundtrip/idempotency_key": "turn_1:toolu_1"},
        )
    ]


async def test_is_error_results_and_transport_failures_are_is_error_tool_results():
    fake = FakeMcp()
    agent, tools = mounted(fake)
    await tools.start()
    await tools.aclose()
    runner = executor(agent, tools)
    fake.answer = SimpleNamespace(
        content=[SimpleNamespace(type="text", text="out of paper")], structured_content=None, is_error=True
    )
    failed = await runner.run_one(APPROVED, TURN)
    assert failed["is_error"] and failed["content"] == "out of paper"
    fake.answer = MCPError(-32602, "Invalid params: order_id")
    refused = await runner.run_one(APPROVED, TURN)
    assert (
        refused["is_error"]
        and refused["content"] == "gift_wrap_order was refused by the giftwrap service: Invalid params: order_id"
    )
    fake.up = False
    down = await runner.run_one(APPROVED, TURN)
    assert down["is_error"] and "giftwrap service could not be reached" in down["content"]


async def test_an_executor_that_has_not_listed_the_server_yet_still_calls_a_declared_tool():
    fake = FakeMcp(up=False)
    agent, tools = mounted(fake)  # never started: nothing listed here
    fake.up = True
    result = await executor(agent, tools).run_one(APPROVED, TURN)
    assert not result.get("is_error") and fake.calls


# -- the agent's declaration -----------------------------------------------------------------------


def test_an_mcp_server_without_a_url_names_the_variable_to_set(monkeypatch):
    monkeypatch.delenv("ROUNDTRIP_MCP_GIFT_WRAP_URL", raising=False)
    with pytest.raises(AgentError, match="set ROUNDTRIP_MCP_GIFT_WRAP_URL"):
        dataclasses.replace(SHOP, mcp_servers=[McpServer("gift-wrap", tools=["wrap"])]).check()
    monkeypatch.setenv("ROUNDTRIP_MCP_GIFT_WRAP_URL", "http://mcp.test/mcp")
    assert dataclasses.replace(SHOP, mcp_servers=[McpServer("gift-wrap", tools=["wrap"])]).check()


def test_a_url_function_that_fails_is_one_line():
    def broken(own):
        raise KeyError("billing_url")

    with pytest.raises(AgentError, match="the URL of MCP server w could not be read: KeyError: 'billing_url'"):
        dataclasses.replace(SHOP, mcp_servers=[McpServer("w", url=broken, tools=["t"])]).check()


@pytest.mark.parametrize(
    "servers, problem",
    [
        ([McpServer("w", url="u", entities={"t": {"a": "parcel"}})], "x-entity kinds without a resolver: ['parcel']"),
        (
            [McpServer("w", url="u", tools=["t"], entities={"s": {"a": "order"}})],
            "entities for tools it does not mount: ['s']",
        ),
        ([McpServer("w", url="u"), McpServer("w", url="v")], "MCP servers declared twice: ['w']"),
        ([McpServer("w", url="u", tools=["list_orders"])], "named like a local tool: ['list_orders']"),
        ([McpServer("w w", url="u")], "MCP server name 'w w'"),
        ([McpServer("w", url="u")], "MCP server w names no tools: list the ones the agent mounts (tools=[...])"),
        ([McpServer("w", url="u", tools="wrap")], "tools must be a list of tool names or 'all', not 'wrap'"),
    ],
)
def test_an_mcp_declaration_that_does_not_fit_fails_at_start(servers, problem):
    with pytest.raises(AgentError) as caught:
        dataclasses.replace(SHOP, mcp_servers=servers).check()
    assert problem in str(caught.value)


def test_a_policy_for_an_undeclared_tool_is_still_refused():
    with pytest.raises(AgentError, match="policies for unknown tools"):
        dataclasses.replace(
            SHOP, mcp_servers=[McpServer("w", url="u")], policies={"gift_wrap_order": SHOP.policies["cancel_order"]}
        ).check()


async def test_the_digest_names_what_the_agent_mounts_not_what_is_listed_and_is_unchanged_without_mcp():
    assert dataclasses.replace(SHOP).digest == SHOP.digest
    agent, tools = mounted(FakeMcp())
    before = dataclasses.replace(agent).digest  # a process that never lists (the gateway, the guard)
    await tools.start()
    await tools.aclose()
    assert "gift_wrap_order" in agent.registry and agent.digest == before != SHOP.digest


def test_a_logged_url_carries_no_credential():
    from roundtrip._sdk.mcp import shown

    assert shown("https://svc:s3cret@billing.internal:8443/mcp?token=abc") == "https://billing.internal:8443/mcp"
    assert shown("http://billing/mcp") == "http://billing/mcp"


def test_the_direct_persona_makes_the_call_written_only_when_the_tool_is_offered():
    from roundtrip._simulator.personas import direct
    from roundtrip._simulator.transcript import Transcript

    def request(*messages):
        return Transcript.from_request(
            {
                "model": "m",
                "tools": [{"name": "gift_wrap_order", "input_schema": {"type": "object"}}],
                "messages": list(messages),
            }
        )

    first = direct.decide(request({"role": "user", "content": 'gift_wrap_order {"order_id": "ord_1", "message": 5}'}))
    assert first.content == [
        {"type": "tool_use", "name": "gift_wrap_order", "input": {"order_id": "ord_1", "message": 5}}
    ]
    declined = direct.decide(request({"role": "user", "content": "refund_order {}"}))
    assert declined.content[0]["text"] == "I cannot do that: there is no tool refund_order."
