"""Existence and ownership of every entity a call references, then the tool's policy.

The principal is the customer of the request envelope, passed in by the handler; tool
input never names it. A missing entity and another customer's entity get the same
answer, so a denial leaks nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from services.tools.context import ToolContext
from services.tools.registry import ToolSpec

# (entity kind, entity id, customer id) -> the entity as the customer may see it, or None
EntityLookup = Callable[[str, str, str], Awaitable[dict[str, Any] | None]]
Policy = Callable[[dict[str, Any], dict[str, dict[str, Any]], ToolContext], Awaitable[str | None]]


class LookupFailed(Exception):
    """The backend could not answer; the gate fails closed."""


async def authorize(
    spec: ToolSpec,
    tool_input: dict[str, Any],
    ctx: ToolContext,
    lookup: EntityLookup,
    policy: Policy | None,
) -> str | None:
    """None when the call may run; otherwise the reason it may not."""
    entities: dict[str, dict[str, Any]] = {}
    for field, kind in spec.entity_refs.items():
        if field not in tool_input:
            continue
        entity_id = tool_input[field]
        try:
            entity = await lookup(kind, entity_id, ctx.customer_id)
        except Exception as exc:  # noqa: BLE001 - any backend failure denies the call
            raise LookupFailed(f"could not verify {kind} {entity_id}: {exc}") from exc
        if entity is None:
            return (
                f"{kind.capitalize()} {entity_id} was not found among this customer's {kind}s. "
                f"Do not guess ids: use list_orders to see the customer's {kind}s and their ids."
            )
        entities[field] = entity
    if policy is not None:
        return await policy(tool_input, entities, ctx)
    return None
