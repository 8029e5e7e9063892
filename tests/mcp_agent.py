"""The demo shop's agent with one MCP tool more, for the MCP tests: `ROUNDTRIP_AGENT=tests.mcp_agent:AGENT`.

The tool is tests/mcp_server.py's `gift_wrap_order`, whose `order_id` the agent annotates as an order (so the gate
checks it belongs to the customer with the shop's resolver); the server's URL is ROUNDTRIP_MCP_GIFTWRAP_URL.
"""

from __future__ import annotations

from dataclasses import replace

from roundtrip import McpServer
from roundtrip._shop.agent import AGENT as SHOP
from tests.mcp_server import TOOL

GIFTWRAP = McpServer("giftwrap", tools=[TOOL], entities={TOOL: {"order_id": "order"}}, timeout_s=5.0, retry_max_s=1.0)
AGENT = replace(SHOP, name="gifting-agent", mcp_servers=[GIFTWRAP])
