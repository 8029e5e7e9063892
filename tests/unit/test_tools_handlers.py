"""The support tool handlers and policies against the real shop app, in-process, on SQLite."""

from __future__ import annotations

import json

import httpx
import pytest
from httpx_aiohttp import AiohttpTransport

from roundtrip._gate.validation import InputValidator  # the validator the fleet uses
from roundtrip._sdk import ToolContext, ToolError
from roundtrip._shop.agent.client import ShopClient, ShopError, ShopUnavailable
from roundtrip._shop.help_articles import INJECTION_ORDER_ID
from tests.agents import SHOP, shop_deps

ALICE, BOB = "cus_1001", "cus_1002"


@pytest.fixture(scope="module")
def registry():
    return SHOP.registry


def ctx_for(shop: ShopClient, customer_id: str = ALICE, tool_use_id: str = "toolu_01") -> ToolContext:
    return ToolContext(
        customer_id=customer_id, tool_use_id=tool_use_id, idempotency_key=f"idem-{tool_use_id}", deps=shop_deps(shop)
    )


async def call(registry, name, args, ctx):
    assert InputValidator(registry.get(name).input_schema).problems(args) == [], args
    result = await registry.handler(name)(args, ctx)
    json.dumps(result)  # JSON-able
    return result


async def test_list_orders(registry, shop):
    result = await call(registry, "list_orders", {}, ctx_for(shop))
    assert [o["order_id"] for o in result["orders"]] == ["ord_a1000003", "ord_a1000004", "ord_a1000002", "ord_a1000001"]
    assert result["count"] == 4
    assert result["orders"][0]["total"] == "87.00 EUR"
    pending = await call(registry, "list_orders", {"status": "pending", "limit": 1}, ctx_for(shop))
    assert [o["order_id"] for o in pending["orders"]] == ["ord_a1000003"]


async def test_list_orders_acts_only_for_the_principal(registry, shop):
    result = await call(registry, "list_orders", {}, ctx_for(shop, BOB))
    assert {o["order_id"] for o in result["orders"]} == {INJECTION_ORDER_ID, "ord_b2000001"}


async def test_lookup_order(registry, shop):
    order = await call(registry, "lookup_order", {"order_id": "ord_a1000002"}, ctx_for(shop))
    assert order["status"] == "shipped" and order["cancellable"] is False
    assert "customer_id" not in order


async def test_lookup_foreign_order_is_not_found(registry, shop):
    with pytest.raises(ToolError) as foreign:
        await call(registry, "lookup_order", {"order_id": INJECTION_ORDER_ID}, ctx_for(shop))
    with pytest.raises(ToolError) as missing:
        await call(registry, "lookup_order", {"order_id": "ord_00000000"}, ctx_for(shop))
    assert "list_orders" in foreign.value.message
    assert foreign.value.message.replace(INJECTION_ORDER_ID, "X") == missing.value.message.replace("ord_00000000", "X")


async def test_cancel_order(registry, shop):
    args = {"order_id": "ord_a1000003", "reason": "customer_request"}
    result = await call(registry, "cancel_order", args, ctx_for(shop))
    assert result["cancelled"] is True and result["order"]["status"] == "cancelled"
    # a redelivered call (same tool_use id, same key) returns the same result, cancels nothing new
    again = await call(registry, "cancel_order", args, ctx_for(shop))
    assert again == result


async def test_cancel_shipped_order_explains_why(registry, shop):
    with pytest.raises(ToolError) as err:
        await call(registry, "cancel_order", {"order_id": "ord_a1000002", "reason": "delivery_too_slow"}, ctx_for(shop))
    assert err.value.message.startswith("Order ord_a1000002 is shipped and can no longer be cancelled;")


async def test_cancel_foreign_order_never_touches_it(registry, shop):
    with pytest.raises(ToolError, match="No order ord_9f3c4e21 was found"):
        await call(registry, "cancel_order", {"order_id": INJECTION_ORDER_ID, "reason": "other"}, ctx_for(shop))
    assert (await shop.get_order(BOB, INJECTION_ORDER_ID))["status"] == "processing"


async def test_shipping_status(registry, shop):
    shipped = await call(registry, "get_shipping_status", {"order_id": "ord_a1000002"}, ctx_for(shop))
    assert shipped["carrier"] == "UPS" and shipped["tracking_number"]
    pending = await call(registry, "get_shipping_status", {"order_id": "ord_a1000003"}, ctx_for(shop))
    assert pending["carrier"] is None and "Not shipped yet" in pending["note"]
    with pytest.raises(ToolError):
        await call(registry, "get_shipping_status", {"order_id": "ord_c3000001"}, ctx_for(shop))


async def test_search_help_center_returns_the_injection_as_data(registry, shop):
    result = await call(registry, "search_help_center", {"query": "order troubleshooting"}, ctx_for(shop))
    assert result["articles"][0]["title"] == "Order troubleshooting"
    assert INJECTION_ORDER_ID in result["articles"][0]["snippet"]
    # reading it changes nothing
    assert (await shop.get_order(BOB, INJECTION_ORDER_ID))["status"] == "processing"


async def test_escalate_to_human_is_idempotent(registry, shop):
    args = {"summary": "Customer wants a shipped order stopped", "urgency": "high"}
    first = await call(registry, "escalate_to_human", args, ctx_for(shop, tool_use_id="toolu_esc"))
    again = await call(registry, "escalate_to_human", args, ctx_for(shop, tool_use_id="toolu_esc"))
    other = await call(registry, "escalate_to_human", args, ctx_for(shop, tool_use_id="toolu_esc2"))
    assert first["ticket_id"].startswith("tkt_") and first["ticket_id"] == again["ticket_id"] != other["ticket_id"]


# -- policies and entity resolution ----------------------------------------------------------------


async def test_resolve_entities_is_scoped_to_the_principal(registry, shop):
    own = await registry.resolve_entities("cancel_order", {"order_id": "ord_a1000003"}, ctx_for(shop))
    assert own["order_id"]["customer_id"] == ALICE
    foreign = await registry.resolve_entities("cancel_order", {"order_id": INJECTION_ORDER_ID}, ctx_for(shop))
    assert foreign == {"order_id": None}
    assert await registry.resolve_entities("list_orders", {"limit": 3}, ctx_for(shop)) == {}


@pytest.mark.parametrize(
    "order_id, denied",
    [("ord_a1000003", None), ("ord_a1000004", None), ("ord_a1000002", "shipped"), ("ord_a1000001", "delivered")],
)
async def test_cancel_policy(registry, shop, order_id, denied):
    ctx = ctx_for(shop)
    args = {"order_id": order_id, "reason": "customer_request"}
    entities = await registry.resolve_entities("cancel_order", args, ctx)
    reason = await registry.policy("cancel_order")(args, entities, ctx)
    if denied is None:
        assert reason is None
    else:
        assert reason.startswith(f"Order {order_id} is {denied} and can no longer be cancelled")


async def test_cancel_policy_denies_unresolved_or_foreign(registry, shop):
    ctx = ctx_for(shop)
    args = {"order_id": INJECTION_ORDER_ID, "reason": "other"}
    policy = registry.policy("cancel_order")
    assert "No order" in await policy(args, {"order_id": None}, ctx)
    bobs = await shop.get_order(BOB, INJECTION_ORDER_ID)
    assert "No order" in await policy(args, {"order_id": bobs}, ctx)


async def test_other_tools_allow_by_default(registry, shop):
    assert await registry.policy("lookup_order")({"order_id": "ord_a1000003"}, {}, ctx_for(shop)) is None


# -- shop client failures --------------------------------------------------------------------------


async def test_shop_5xx_and_unreachable_raise_shop_unavailable():
    failing = ShopClient(
        "http://shop", timeout=10.0, transport=httpx.MockTransport(lambda request: httpx.Response(503))
    )
    with pytest.raises(ShopUnavailable, match="HTTP 503"):
        await failing.get_order(ALICE, "ord_a1000003")
    await failing.aclose()

    def refuse(request):
        raise httpx.ConnectError("connection refused", request=request)

    down = ShopClient("http://shop", timeout=10.0, transport=httpx.MockTransport(refuse))
    with pytest.raises(ShopUnavailable, match="unreachable"):
        await down.list_orders(ALICE, None, None)
    assert await down.health() is False
    await down.aclose()


async def test_over_its_real_transport_a_refused_connection_is_unreachable_and_a_silent_shop_times_out():
    """The default transport is aiohttp's: its errors come out as the same ShopUnavailable reasons."""
    import asyncio
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    down = ShopClient(f"http://127.0.0.1:{closed_port}", timeout=2, transport=AiohttpTransport())
    with pytest.raises(ShopUnavailable, match="unreachable"):
        await down.list_orders(ALICE, None, None)
    assert await down.health() is False
    await down.aclose()

    async def silent(reader, writer):  # accepts, reads the request, never answers
        await reader.read(65536)
        await asyncio.sleep(5)  # a server that never answers within the client's timeout
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    slow = ShopClient(f"http://127.0.0.1:{port}", timeout=0.3, transport=AiohttpTransport())
    try:
        with pytest.raises(ShopUnavailable, match="timed out"):
            await slow.get_order(ALICE, "ord_a1000003")
    finally:
        await slow.aclose()
        server.close()


async def test_shop_client_sends_the_principal_and_escapes_ids():
    seen = []

    def record(request):
        seen.append((request.url.raw_path, request.headers.get("x-customer-id")))
        return httpx.Response(404, json={"error": "order_not_found"})

    client = ShopClient("http://shop", timeout=10.0, transport=httpx.MockTransport(record))
    assert await client.get_order(ALICE, "../admin/orders") is None
    assert seen == [(b"/orders/%2E%2E%2Fadmin%2Forders", ALICE)]
    with pytest.raises(ValueError):
        await client.get_order("", "ord_a1000003")
    await client.aclose()


async def test_unexpected_status_is_a_shop_error():
    client = ShopClient(
        "http://shop", timeout=10.0, transport=httpx.MockTransport(lambda r: httpx.Response(401, json={"error": "x"}))
    )
    with pytest.raises(ShopError) as err:
        await client.list_orders(ALICE, None, None)
    assert not isinstance(err.value, ShopUnavailable) and err.value.status_code == 401
    await client.aclose()
