"""The gate service: turn.tool_calls -> (validate, authorize, sign) -> turn.tool_batches."""

from __future__ import annotations

import logging

from services.gate.handlers import Gate
from faststream import FastStream

from services.kernel import topics
from services.kernel.approvals import DecisionSigner, Signer, parse_keys
from services.kernel.events import CheckToolCalls, ExecuteToolBatch
from services.kernel.messaging import Outlet, make_broker, service_app, subscribe
from services.kernel.settings import Settings
from services.tools.context import ToolContext
from services.tools.registry import load_registry
from services.tools.shop_client import ShopClient
from services.tools.support import ApprovalLimits

log = logging.getLogger("roundtrip.gate")


def build(settings: Settings) -> FastStream:
    broker = make_broker("gate", settings)
    execute = Outlet(broker, topics.TOOL_BATCHES, ExecuteToolBatch)
    shop = ShopClient(settings.shop_base_url, timeout=settings.tool_timeout_s)

    registry = load_registry()

    async def lookup(kind: str, entity_id: str, customer_id: str):
        """The tool pack's resolver of that entity kind, scoped to the request's principal."""
        ctx = ToolContext(customer_id=customer_id, tool_use_id="", idempotency_key="", shop=shop)
        return await registry.entity_resolver(kind)(entity_id, ctx)

    gate = Gate(registry=registry, lookup=lookup, signer=Signer(parse_keys(settings.approval_keys)), shop=shop,
                batch_ttl_s=settings.stuck_after_s,
                approval_limits=ApprovalLimits(cancel_above_cents=settings.approval_cancel_above_cents),
                decisions=DecisionSigner(parse_keys(settings.decision_keys)), approval_timeout_s=settings.approval_timeout_s)

    @subscribe(broker, topics.TOOL_CALLS, "gate", settings)
    async def on_check_tool_calls(command: CheckToolCalls) -> None:
        batch = await gate.check(command)
        rejected = [c.name for c in batch.calls if not c.approved]
        if rejected:
            log.info("turn %s step %d: rejected %s", command.turn.turn_id, command.step, rejected)
        await execute(batch, command.turn.conversation_id)

    app = service_app(broker, log)
    app.on_startup(lambda: settings.refuse_dev_approval_key("gate"))  # outside development, never the published key
    app.on_startup(lambda: settings.refuse_dev_decision_key("gate"))
    app.after_shutdown(shop.aclose)
    return app
