"""What a tool handler gets besides the model's input: the principal and the shop client.

The principal (`customer_id`) comes from the support request envelope, never from the
model. `idempotency_key` is derived from the tool_use id by the executor, so a redelivered
call performs its side effect once.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.tools.shop_client import ShopClient


@dataclass
class ToolContext:
    customer_id: str
    tool_use_id: str
    idempotency_key: str
    shop: ShopClient


class ToolError(Exception):
    """A failure the model should see (as an `is_error` tool_result) and can act on."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
