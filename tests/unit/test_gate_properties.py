"""Property test of the gate against the REAL shop (in-process ASGI app on a SQLite file).

Hypothesis generates steps of hostile and honest tool calls for a random principal: wrong
types, missing and extra fields, invented enums, other customers' ids, ids that do not exist,
near-miss ids (case, whitespace, Cyrillic/fullwidth look-alikes, zero-width characters,
trailing newlines), huge and deeply nested inputs, non-object inputs and unknown tool names.

Every example checks CALLS_PER_EXAMPLE calls, over MAX_EXAMPLES examples: at least 10,000
calls in total (asserted on a counter at the end). Invariants:
- Gate.check_call never raises;
- every rejection carries a non-empty error; schema errors name the failing field;
- every approved call is schema-valid, every order it references exists and belongs to the
  principal (ground truth: the shop's database), and cancel_order is approved only for a
  cancellable order;
- running the approved calls through the real handlers (ToolContext with the principal)
  never changes an order of another customer, and changes only orders an approved
  cancel_order named.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from roundtrip._gate.gate import Gate
from roundtrip._kernel.wire.events import ToolCall
from roundtrip._sdk.context import ToolContext, ToolError
from roundtrip._shop.agent.client import ShopClient
from tests.agents import SHOP, shop_deps
from tests.gate_calls import check_call
from tests.shop import in_process
from tests.signing import pair

MAX_EXAMPLES = 420
CALLS_PER_EXAMPLE = 24  # 420 x 24 = 10,080 calls
ORDER_ID = re.compile(r"ord_[0-9a-f]{8}")  # fullmatch: the strict truth, independent of the gate's regex
CUSTOMERS = ["cus_1001", "cus_1002", "cus_1003"]
REASONS = ["customer_request", "duplicate_order", "wrong_item", "delivery_too_slow", "other"]
STATUSES = ["pending", "processing", "shipped", "delivered", "cancelled"]
URGENCIES = ["low", "normal", "high"]
KNOWN_IDS = [
    "ord_a1000001", "ord_a1000002", "ord_a1000003", "ord_a1000004",
    "ord_9f3c4e21", "ord_b2000001", "ord_c3000001", "ord_c3000002",
]  # fmt: skip
CANCELLABLE = ("pending", "processing")
REGISTRY = SHOP.registry


# -- strategies -------------------------------------------------------------------------------

LOOKALIKES = {"a": "\u0430", "c": "\u0441", "e": "\u0435", "o": "\u043e", "0": "\uff10", "1": "\uff11", "3": "\uff13"}


@st.composite
def near_miss(draw: st.DrawFn, real: str) -> str:
    kind = draw(
        st.sampled_from(
            ["upper", "title", "space", "newline", "lookalike", "zwsp", "truncate", "extend", "nbsp", "tab"]
        )
    )
    if kind == "upper":
        return real.upper()
    if kind == "title":
        return real[:1].upper() + real[1:]
    if kind == "space":
        return draw(st.sampled_from([" " + real, real + " ", real[:4] + " " + real[4:]]))
    if kind == "newline":
        return draw(st.sampled_from([real + "\n", "\n" + real, real + "\r\n"]))
    if kind == "lookalike":
        spots = [i for i, ch in enumerate(real) if ch in LOOKALIKES]
        i = draw(st.sampled_from(spots))
        return real[:i] + LOOKALIKES[real[i]] + real[i + 1 :]
    if kind == "zwsp":
        i = draw(st.integers(0, len(real)))
        return real[:i] + draw(st.sampled_from(["\u200b", "\u200d", "\ufeff", "\u2060"])) + real[i:]
    if kind == "nbsp":
        return real + "\u00a0"
    if kind == "tab":
        return real + "\t"
    if kind == "truncate":
        return real[: draw(st.integers(4, len(real) - 1))]
    return real + draw(st.sampled_from(["0", "f", "00"]))


order_ids = st.one_of(
    st.sampled_from(KNOWN_IDS),  # own or someone else's, depending on the principal
    st.sampled_from(KNOWN_IDS),  # (twice: real ids are where authorization matters)
    st.sampled_from(KNOWN_IDS),
    st.from_regex(ORDER_ID, fullmatch=True),  # well-formed, almost surely non-existent
    st.sampled_from(KNOWN_IDS).flatmap(near_miss),
    st.text(max_size=20),
)

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def deep(depth: int) -> Any:
    value: Any = {"order_id": "ord_a1000003"}
    for i in range(depth):
        value = {"x": value} if i % 2 else [value]
    return value


def valid_input(name: str, draw: st.DrawFn) -> dict[str, Any]:
    if name == "list_orders":
        out: dict[str, Any] = {}
        if draw(st.booleans()):
            out["status"] = draw(st.sampled_from(STATUSES))
        if draw(st.booleans()):
            out["limit"] = draw(st.integers(1, 50))
        return out
    if name in ("lookup_order", "get_shipping_status"):
        return {"order_id": draw(order_ids)}
    if name == "cancel_order":
        return {"order_id": draw(order_ids), "reason": draw(st.sampled_from(REASONS))}
    if name == "search_help_center":
        return {"query": draw(st.sampled_from(["order troubleshooting", "refund", "cancel shipped order", "returns"]))}
    return {
        "summary": draw(st.sampled_from(["Customer wants a refund for ord_a1000001", "Please help with my account"])),
        "urgency": draw(st.sampled_from(URGENCIES)),
    }


@st.composite
def calls(draw: st.DrawFn) -> tuple[str, Any, str | None]:
    """(tool name, input, a field name the error must mention when rejected as invalid, or None)."""
    name = draw(st.sampled_from(REGISTRY.names))
    schema = REGISTRY.specs[name].input_schema
    base = valid_input(name, draw)
    fields = list(schema["properties"])
    mutation = draw(st.sampled_from(
        ["none", "none", "none", "wrong_type", "missing", "extra", "enum", "override_customer",
         "non_object", "huge", "deep", "random", "unknown_tool", "big_int", "nan"]
    ))  # fmt: skip
    if mutation == "wrong_type" and fields:
        field = draw(st.sampled_from(fields))
        expected = schema["properties"][field]["type"]
        bad = draw(json_values.filter(lambda v: not Draft202012Validator({"type": expected}).is_valid(v)))
        return name, {**base, field: bad}, field
    if mutation == "missing" and schema["required"]:
        field = draw(st.sampled_from(schema["required"]))
        return name, {k: v for k, v in base.items() if k != field}, field
    if mutation == "extra":
        key = draw(
            st.sampled_from(["customer", "force", "confirm", "order", "id", "note"]) | st.text(min_size=1, max_size=10)
        )
        if key in schema["properties"]:
            return name, base, None
        return name, {**base, key: draw(json_values)}, None  # the key may be unprintable: named escaped, not compared
    if mutation == "enum":
        enums = [f for f in fields if "enum" in schema["properties"][f]]
        if enums:
            field = draw(st.sampled_from(enums))
            allowed = schema["properties"][field]["enum"]
            bad = draw(
                st.sampled_from(["urgent", "changed_my_mind", "CANCELLED", "in_transit", "Customer_Request", "other "])
                | st.text(max_size=12)
            )
            if bad not in allowed:
                return name, {**base, field: bad}, field
        return name, base, None
    if mutation == "override_customer":
        return (
            name,
            {**base, draw(st.sampled_from(["customer_id", "customer", "principal"])): draw(st.sampled_from(CUSTOMERS))},
            None,
        )
    if mutation == "non_object":
        return name, draw(st.one_of(json_scalars, st.lists(json_values, max_size=3), st.just([base]))), None
    if mutation == "huge":
        size = draw(st.sampled_from([17_000, 40_000, 200_000]))
        field = draw(st.sampled_from(fields or ["blob"]))
        return name, {**base, field: "x" * size}, None
    if mutation == "deep":
        return name, {**base, (fields or ["x"])[0]: deep(draw(st.sampled_from([9, 50, 800])))}, None
    if mutation == "random":
        return name, draw(st.dictionaries(st.sampled_from([*fields, "x", "order_id"]), json_values, max_size=4)), None
    if mutation == "unknown_tool":
        bad = draw(
            st.sampled_from(
                [
                    name.upper(),
                    name + " ",
                    "cancel-order",
                    "cancelOrder",
                    "delete_order",
                    "refund_order",
                    "",
                    "\u200b" + name,
                ]
            )
            | st.text(max_size=30)
        )
        if bad in REGISTRY.specs:
            return name, base, None
        return bad, base, None
    if mutation == "big_int" and fields:
        field = draw(st.sampled_from(fields))
        return name, {**base, field: draw(st.sampled_from([2**53, 2**64, -(2**80)]))}, field
    if mutation == "nan" and fields:
        field = draw(st.sampled_from(fields))
        return name, {**base, field: draw(st.sampled_from([float("nan"), float("inf"), float("-inf")]))}, field
    return name, base, None


steps = st.tuples(
    st.sampled_from(CUSTOMERS),
    st.lists(calls(), min_size=CALLS_PER_EXAMPLE, max_size=CALLS_PER_EXAMPLE),
    st.integers(0, 3).map(bool),
)  # reset 3 times in 4


# -- the shop in-process, on its own loop ----------------------------------------------------------


class Shop:
    def __init__(self, url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._cm = in_process(url)
        transport = self.loop.run_until_complete(self._cm.__aenter__())
        self.client = ShopClient("http://shop", timeout=10.0, transport=transport)
        self.admin = httpx.AsyncClient(base_url="http://shop", transport=transport)

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    async def orders(self) -> dict[str, tuple[str, str]]:
        return {o["order_id"]: (o["customer_id"], o["status"]) for o in await self.client.admin_orders()}

    async def reset(self) -> None:
        (await self.admin.post("/admin/reset")).raise_for_status()

    def close(self) -> None:
        self.run(self.client.aclose())
        self.run(self.admin.aclose())
        self.run(self._cm.__aexit__(None, None, None))
        self.loop.close()


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory):
    s = Shop(f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('gateprop')}/shop.db")
    yield s
    s.close()


def make_gate(shop: Shop) -> Gate:
    async def lookup(kind: str, entity_id: str, customer_id: str):
        assert kind == "order"
        return await shop.client.get_order(customer_id, entity_id)

    return Gate(
        registry=REGISTRY,
        lookup=lookup,
        signer=pair("k1").signer,
        deps=shop_deps(shop.client),
        agent_settings=SHOP.own_settings,
    )


# -- the property ------------------------------------------------------------------------------


def test_gate_never_crashes_never_approves_the_unauthorized_and_always_explains(shop: Shop) -> None:
    gate = make_gate(shop)
    tally: Counter[str] = Counter()
    strict = {name: Draft202012Validator(spec.input_schema) for name, spec in REGISTRY.specs.items()}

    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )
    @given(steps)
    def run(step: tuple[str, list[tuple[str, Any, str | None]], bool]) -> None:
        principal, drafted, reset = step
        shop.run(check_and_execute(gate, shop, principal, drafted, reset, strict, tally))

    run()
    print(f"\ngate property: {dict(tally)}")
    assert tally["calls"] >= 10_000, tally  # the issue asks for at least 10,000 generated calls
    # the generator must actually exercise both outcomes and the interesting cases
    assert tally["approved"] > 1_000 and tally["rejected"] > 4_000, tally
    # (the split varies a little between runs: Hypothesis' phases are partly time-driven)
    assert tally["approved_cancel"] >= 5 and tally["denied_foreign_or_missing"] > 200, tally
    assert tally["executed_cancel"] >= 3, tally


async def check_and_execute(
    gate: Gate, shop: Shop, principal: str, drafted: list, reset: bool, strict: dict, tally: Counter
) -> None:
    if reset:
        await shop.reset()  # bring cancellable orders back now and then, so approvals of cancel_order keep happening
    before = await shop.orders()
    approved = []
    for i, (name, tool_input, field) in enumerate(drafted):
        call = ToolCall(id=f"toolu_{i}", name=name, input=tool_input, fingerprint="fp")
        tally["calls"] += 1
        checked = await check_call(gate, call, principal, "turn_prop")  # must not raise
        if not checked.approved:
            tally["rejected"] += 1
            assert isinstance(checked.error, str) and checked.error.strip(), checked
            if checked.error.startswith("Invalid input"):
                assert "`" in checked.error or "the input" in checked.error, checked.error
                if field is not None and name in REGISTRY.specs and isinstance(tool_input, dict):
                    assert f"`{field}" in checked.error, (field, checked.error)  # `limit` or `limit[0]`
            if checked.error.startswith("Not allowed") and "not found among" in checked.error:
                tally["denied_foreign_or_missing"] += 1
            continue
        tally["approved"] += 1
        assert name in REGISTRY.specs
        assert strict[name].is_valid(tool_input), tool_input
        for ref_field in REGISTRY.specs[name].entity_refs:
            if ref_field in tool_input:
                order_id = tool_input[ref_field]
                assert ORDER_ID.fullmatch(order_id), order_id
                assert order_id in before and before[order_id][0] == principal, (
                    principal,
                    order_id,
                    before.get(order_id),
                )
        if name == "cancel_order":
            assert before[tool_input["order_id"]][1] in CANCELLABLE, (tool_input, before[tool_input["order_id"]])
            tally["approved_cancel"] += 1
        approved.append(checked)

    for checked in approved:  # the real handlers, as the executor runs them
        ctx = ToolContext(
            customer_id=principal,
            tool_use_id=checked.id,
            idempotency_key=f"turn_prop_{id(drafted)}:{checked.id}",
            deps=shop_deps(shop.client),
        )
        try:
            await REGISTRY.handler(checked.name)(checked.input, ctx)
            tally["executed_" + checked.name.split("_")[0]] += 1
        except ToolError:
            tally["tool_errors"] += 1  # e.g. the second approved cancel of the same order in one step
    after = await shop.orders()
    assert set(after) == set(before)
    cancel_targets = {c.input["order_id"] for c in approved if c.name == "cancel_order"}
    for order_id, (owner, status) in after.items():
        if (owner, status) != before[order_id]:
            assert owner == principal, f"{principal} changed {order_id} of {owner}"
            assert order_id in cancel_targets and status == "cancelled", (order_id, before[order_id], status)
