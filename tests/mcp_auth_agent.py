"""The demo shop's agent with two MCP servers that require credentials, for tests/e2e/test_mcp_auth_e2e.py:
`ROUNDTRIP_AGENT=tests.mcp_auth_agent:AGENT`.

- giftwrap (tests/mcp_auth_server.py in `token` mode): `gift_wrap_order`, a bearer token from the mounted secret file
  MCP_TEST_TOKEN_FILE;
- engraving (tests/mcp_auth_server.py in `oauth` mode, behind tests/oauth_server.py): `engrave_order`, OAuth client
  credentials of the client `roundtrip` at MCP_TEST_ISSUER, its secret in MCP_TEST_CLIENT_SECRET.

Their URLs are ROUNDTRIP_MCP_GIFTWRAP_URL and ROUNDTRIP_MCP_ENGRAVING_URL.
"""

from __future__ import annotations

import os
from dataclasses import replace

from roundtrip import BearerToken, ClientCredentials, McpServer
from roundtrip._shop.agent import AGENT as SHOP

GIFTWRAP = McpServer(
    "giftwrap",
    tools=["gift_wrap_order"],
    entities={"gift_wrap_order": {"order_id": "order"}},
    auth=BearerToken(file=os.environ.get("MCP_TEST_TOKEN_FILE", "/nonexistent/token")),
    timeout_s=5.0,
    retry_max_s=1.0,
)
ENGRAVING = McpServer(
    "engraving",
    tools=["engrave_order"],
    entities={"engrave_order": {"order_id": "order"}},
    auth=ClientCredentials(
        issuer=os.environ.get("MCP_TEST_ISSUER", "http://127.0.0.1:9"),
        client_id="roundtrip",
        client_secret_env="MCP_TEST_CLIENT_SECRET",
    ),
    timeout_s=5.0,
    retry_max_s=1.0,
)
AGENT = replace(SHOP, name="gifting-agent", mcp_servers=[GIFTWRAP, ENGRAVING])
