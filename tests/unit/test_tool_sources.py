"""The one tool-source protocol (services/_sdk/sources.py) with each of its kinds: a folder of JSON Schema documents, a
Python function, and an MCP server (tests/mcp_server.py, a real server of the `mcp` package in its own process, over
streamable HTTP); then one agent that mixes all three in `tools=[...]`, through `roundtrip.testing.arun_turn`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import pytest

from roundtrip import Agent, Dependencies, Entity, McpServer, SchemaFolder, ToolContext, ToolError, ToolSource, tool
from roundtrip._broker.embedded import free_port
from roundtrip.testing import FunctionModel, arun_turn, call
from tests.agents import SCHEMAS, SHOP
from tests.mcp_server import TOOL, answers, calls, start

ALICE, OWN, FOREIGN = "cus_1001", "ord_a1000001", "ord_9f3c4e21"  # ord_9f3c4e21 is cus_1002's
SHOP_TOOLS = [
    "cancel_order",
    "escalate_to_human",
    "get_shipping_status",
    "list_orders",
    "lookup_order",
    "search_help_center",
]


@tool
async def add_order_note(ctx: ToolContext, order_id: Annotated[str, Entity("order")], note: str) -> dict:
    """Add a short note for the support team to one of the customer's orders."""
    return {"order_id": order_id, "note": note, "by": ctx.customer_id}


def ctx(**deps) -> ToolContext:
    return ToolContext(
        customer_id=ALICE, tool_use_id="toolu_1", idempotency_key="turn_1:toolu_1", deps=Dependencies(deps)
    )


@pytest.fixture(scope="module")
def giftwrap(tmp_path_factory):
    """tests/mcp_server.py serving on a free port: (its URL, the log of the calls it received)."""
    import time

    folder = tmp_path_factory.mktemp("giftwrap")
    port = free_port()
    url, log = f"http://127.0.0.1:{port}/mcp", folder / "calls.jsonl"
    process = start(port, log, folder / "server.out")
    try:
        for _ in range(300):
            if answers(url) or process.poll() is not None:
                break
            time.sleep(0.1)  # poll interval: the MCP server answering
        assert answers(url), (folder / "server.out").read_text(errors="replace")
        yield url, log
    finally:
        process.terminate()
        process.wait(10)


def giftwrap_server(url: str, **fields) -> McpServer:
    return McpServer("giftwrap", url=url, tools=[TOOL], entities={TOOL: {"order_id": "order"}}, **fields)


# -- each kind, through the protocol ---------------------------------------------------------------


async def test_a_schema_folder_offers_its_documents_bound_to_their_handlers(shop):
    folder = SchemaFolder(SCHEMAS, handlers=SHOP.handlers)
    assert isinstance(folder, ToolSource) and sorted(folder.specs()) == SHOP_TOOLS
    assert folder.specs()["lookup_order"].entity_refs == {"order_id": "order"}
    assert folder.handlers()["lookup_order"] is SHOP.handlers["lookup_order"] and folder.problems({"order"}) == []
    listed: list[ToolSource] = []
    await folder.start(listed.append)  # nothing to open, nothing listed later
    found = await folder.call("lookup_order", {"order_id": OWN}, ctx(shop=shop))
    await folder.close()
    assert listed == [] and found["order_id"] == OWN
    with pytest.raises(ToolError, match="Tool refund_order has no handler"):
        await SchemaFolder(SCHEMAS).call("refund_order", {}, ctx())
    assert SchemaFolder("/nonexistent/tools").problems(set()) == ["schema folder /nonexistent/tools is not a folder"]


async def test_a_function_tool_is_a_source_of_its_one_tool():
    assert isinstance(add_order_note, ToolSource) and list(add_order_note.specs()) == ["add_order_note"]
    assert add_order_note.specs()["add_order_note"].entity_refs == {"order_id": "order"}
    assert add_order_note.handlers() == {"add_order_note": add_order_note} and add_order_note.problems({"order"}) == []
    assert await add_order_note.call("add_order_note", {"order_id": OWN, "note": "gift"}, ctx()) == {
        "order_id": OWN,
        "note": "gift",
        "by": ALICE,
    }

    def not_async(order_id: str) -> dict:
        """A tool written as a plain function, which cannot be awaited."""
        return {}

    broken = tool(not_async)
    assert list(broken.specs()) == ["not_async"]  # its document is fine: the function is what cannot run
    assert broken.problems(set()) == ["tool not_async: the function must be `async def`"]


async def test_an_mcp_server_offers_what_it_lists_once_a_process_starts_it(giftwrap):
    url, log = giftwrap
    server = giftwrap_server(url)
    assert server.specs() == {} and server.declared() == {TOOL}  # known by name before any process lists it
    mount = server.bind(None)
    listed: list[ToolSource] = []
    await mount.start(listed.append)
    try:
        assert listed == [mount] and list(mount.specs()) == [TOOL]
        assert mount.specs()[TOOL].entity_refs == {"order_id": "order"}  # the agent's annotation, on the listed schema
        result = await mount.call(TOOL, {"order_id": OWN, "message": "Happy birthday"}, ctx())
        assert result["gift_wrapped"] is True and calls(log)[-1]["customer_id"] == ALICE
        with pytest.raises(ToolError, match="out of paper"):
            await mount.call(TOOL, {"order_id": OWN, "message": "out of paper"}, ctx())
    finally:
        await mount.close()


async def test_an_mcp_server_that_is_down_is_started_anyway_and_says_why_its_tools_cannot_be_called():
    mount = giftwrap_server(f"http://127.0.0.1:{free_port()}/mcp", timeout_s=2.0, retry_max_s=0.2).bind(None)
    listed: list[ToolSource] = []
    await mount.start(listed.append)  # returns after the first attempt
    await mount.close()
    assert listed == [] and mount.specs() == {}
    assert "the giftwrap service it belongs to cannot be reached right now" in mount.unavailable(TOOL)


# -- one agent, every kind -------------------------------------------------------------------------


def mixed(url: str) -> Agent:
    return Agent(
        name="mixed-agent",
        system_prompt=SHOP.system_prompt,
        tools=[SchemaFolder(SCHEMAS, handlers=SHOP.handlers), add_order_note, giftwrap_server(url)],
        policies=SHOP.policies,
        entities=SHOP.entities,
        approvals=SHOP.approvals,
        serial=SHOP.serial,
        settings=SHOP.settings,
        dependencies=SHOP.dependencies,
    )


async def test_an_agent_mixes_a_schema_folder_a_function_and_an_mcp_server_in_one_tools_list(giftwrap, shop):
    url, log = giftwrap
    agent = mixed(url).check()
    offered: list[list[str]] = []

    def model(messages, info):
        offered.append([t["name"] for t in info.tools])
        if info.step == 1:
            return [
                call("lookup_order", order_id=OWN),
                call("add_order_note", order_id=OWN, note="a gift"),
                call(TOOL, order_id=OWN, message="Happy birthday"),
                call(TOOL, order_id=FOREIGN, message="Hi"),
            ]
        return "Your order is wrapped and noted."

    before = len(calls(log))
    result = await arun_turn(agent, ALICE, "Wrap my order as a gift", FunctionModel(model), deps={"shop": shop})
    assert result.outcome == "end_turn" and offered[0] == sorted([*SHOP_TOOLS, "add_order_note", TOOL])
    looked, noted, wrapped, foreign = result.calls
    assert looked.ok and looked.result["order_id"] == OWN
    assert noted.ok and noted.result == {"order_id": OWN, "note": "a gift", "by": ALICE}
    assert wrapped.ok and wrapped.result["gift_wrapped"] is True
    # the agent's annotation binds the MCP tool's order_id to the shop's resolver: the gate refuses a foreign order
    assert foreign.is_error and "not found among this customer's orders" in foreign.content
    assert [c["arguments"]["order_id"] for c in calls(log)[before:]] == [OWN]


def test_a_tool_two_sources_declare_is_refused_naming_it():
    twice = Agent(
        name="twice",
        system_prompt="Help.",
        tools=[SchemaFolder(SCHEMAS, handlers=SHOP.handlers), SchemaFolder(SCHEMAS, handlers=SHOP.handlers)],
        entities=SHOP.entities,
    )
    assert f"schema folder {SCHEMAS}: tool lookup_order is declared twice" in twice.problems()


def test_the_tools_dir_shorthand_is_a_schema_folder_source():
    (folder,) = SHOP.sources
    assert (
        isinstance(folder, SchemaFolder) and folder.path == Path(SHOP.tools_dir) and folder.handlers() == SHOP.handlers
    )
